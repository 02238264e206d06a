"""A burst of new connections is accepted in a few turns of the event loop, not one per
turn (libuv's own server), so on a busy worker it does not wait in the kernel's queue."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import ClassVar

import uvloop

from ballast.server.accept import GatewayLoop

BURST = 200


class Counted(asyncio.Protocol):
    made = 0
    transports: ClassVar[list[asyncio.BaseTransport]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Counted.made += 1
        Counted.transports.append(transport)


def turns_to_accept(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> int:
    """Turns of the loop until a queued burst of BURST connections has all been made."""
    loop = loop_factory()
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(BURST * 2)
    clients: list[socket.socket] = []
    try:

        async def measure() -> int:
            Counted.made = 0
            server = await loop.create_server(Counted, sock=listening, backlog=BURST * 2)
            for _ in range(BURST):  # completed by the kernel, queued for accept
                client = socket.create_connection(listening.getsockname())
                clients.append(client)
            turns = 0
            while Counted.made < BURST and turns < BURST * 4:
                await asyncio.sleep(0)  # one turn
                turns += 1
            server.close()
            # The accepted connections are the test's to close, before the loop closes.
            for transport in Counted.transports:
                transport.close()
            Counted.transports.clear()
            await server.wait_closed()
            await asyncio.sleep(0)
            return turns

        return loop.run_until_complete(measure())
    finally:
        for client in clients:
            client.close()
        listening.close()
        loop.close()


def test_a_burst_is_accepted_in_a_few_turns() -> None:
    GatewayLoop.accept_batch = 128
    assert turns_to_accept(GatewayLoop) <= 10


def test_libuvs_own_server_takes_one_connection_a_turn() -> None:
    """Why server/accept.py exists: should this ever fail, libuv accepts in batches again."""
    assert turns_to_accept(uvloop.Loop) >= BURST // 2


def test_accept_batch_one_is_libuvs_pace() -> None:
    GatewayLoop.accept_batch = 1
    try:
        assert turns_to_accept(GatewayLoop) >= BURST // 2
    finally:
        GatewayLoop.accept_batch = 128

"""What a misbehaving upstream does to its connection: pause (noticing a client that left),
reset with a TCP RST, or close without ending the body. Shared by every wire the simulator
speaks."""

from __future__ import annotations

import asyncio
import socket
import struct

from aiohttp import web

from ballast.sim.state import SIM_STATE

POLL_SECONDS = 0.02


def gone(request: web.Request) -> bool:
    transport = request.transport
    if transport is not None and request.app[SIM_STATE].closing:
        transport.abort()  # shutting down: end hanging and stalled requests now
    return transport is None or transport.is_closing()


async def pause(request: web.Request, seconds: float) -> bool:
    """Sleep ``seconds`` (may be inf); False as soon as the client has gone away."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not gone(request):
        remaining = deadline - loop.time()
        if remaining <= 0:
            return True
        await asyncio.sleep(min(remaining, POLL_SECONDS))
    return False


def reset(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER on, zero timeout)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def close(request: web.Request) -> None:
    """Close the connection (buffered bytes are still sent) without ending the body."""
    transport = request.transport
    if transport is not None:
        transport.close()

"""The write guard on a manual clock: a write that waits past the timeout cuts the request
(the connection aborted, the handler cancelled), writes that go through never do, and the
guard costs one timer per stream, not one per write."""

from __future__ import annotations

import asyncio

from ballast.pipeline.asgi import WriteGuard
from ballast.resilience.clock import ManualClock
from ballast.types import Message


class Client:
    """A client socket: writes go through while it reads, and wait while it does not."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.reading.set()
        self.written = 0
        self.aborted = False

    async def send(self, message: Message) -> None:
        await self.reading.wait()
        self.written += 1

    def abort(self) -> None:
        self.aborted = True


async def test_a_write_waiting_past_the_timeout_aborts_and_cancels() -> None:
    clock, client = ManualClock(), Client()

    async def handler() -> WriteGuard:
        guard = WriteGuard(client.send, 30.0, clock, client.abort)
        guard.arm()
        for _ in range(100):
            await guard.send({"type": "http.response.body", "body": b"x", "more_body": True})
            clock.advance(1.0)  # 100 writes over 100 s, each one quick
        assert len(clock.pending) == 1  # one timer for the stream, re-armed as it goes
        client.reading.clear()  # the client stops reading
        try:
            await guard.send({"type": "http.response.body", "body": b"x", "more_body": True})
        except asyncio.CancelledError:
            assert guard.fired
            return guard
        raise AssertionError("not cut")

    task = asyncio.create_task(handler())
    for _ in range(200):
        await asyncio.sleep(0)
    assert not task.done()
    clock.advance(29.0)
    await asyncio.sleep(0)
    assert not task.done() and not client.aborted
    clock.advance(2.0)
    guard = await asyncio.wait_for(task, 1)
    assert client.aborted and client.written == 100
    guard.stop()
    assert clock.pending == []


async def test_an_unarmed_guard_is_the_server_send_itself() -> None:
    clock, client = ManualClock(), Client()
    guard = WriteGuard(client.send, 1.0, clock, client.abort)
    client.reading.clear()
    pending = asyncio.ensure_future(guard.send({"type": "http.response.body", "body": b""}))
    clock.advance(10.0)
    await asyncio.sleep(0)
    assert not guard.fired and not pending.done() and clock.pending == []
    client.reading.set()
    await pending
    assert not guard.fired and client.written == 1

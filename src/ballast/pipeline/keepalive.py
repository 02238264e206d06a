"""Keeping a client's connection busy while a stream waits for its first token.

Load balancers in front of a gateway (AWS ALB, nginx) cut a connection that stays idle for
a minute, and a reasoning model can think longer than that before its first token. After
`interval` seconds without one, the response starts (200, an event stream) and an SSE
comment goes out, then another every `interval` seconds. Clients skip comments. A failover
after that is still silent (comments, then the next deployment's events); a final failure
is an error event. Before the first comment nothing changes: a failure can still be a
status code."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from ballast.resilience.clock import Clock, Timer
from ballast.types import Send

COMMENT = b": keep-alive\n\n"


class KeepAlive:
    """One stream's keep-alive: a timer while the first token is awaited, and the beat it
    starts when it fires. `stop` ends both before anything else is sent."""

    __slots__ = ("_clock", "_interval", "_send", "_start", "_task", "_timer", "started")

    def __init__(
        self,
        clock: Clock,
        interval: float,
        send: Send,
        start: Callable[[], Awaitable[None]],
        started: bool = False,
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._send = send
        self._start = start  # sends the response's start (the headers of an event stream)
        self._task: asyncio.Task[None] | None = None
        self.started = started  # the response has started (headers are out)
        self._timer: Timer | None = clock.call_later(interval, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        if not self.started:
            self.started = True  # before the send: its bytes are written at once
            await self._start()
        await self._send({"type": "http.response.body", "body": COMMENT, "more_body": True})
        self._timer = self._clock.call_later(self._interval, self._fire)

    async def stop(self) -> None:
        """No more comments: the first token came, or the stream will not start. A comment
        being written is finished first, so nothing interleaves with what follows."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        self._task = None
        if task is not None and not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()  # our own request was cancelled: the client is gone
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise
        if self._timer is not None:  # the beat re-armed itself as it ended
            self._timer.cancel()
            self._timer = None

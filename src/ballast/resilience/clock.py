"""Time as a dependency, so tests can move a 15-minute window in milliseconds. Timers are
part of it: an I/O deadline armed on the clock moves with it, as the readings do."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """An armed callback; `cancel` is idempotent (asyncio's TimerHandle is one)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (deadlines, windows)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (timestamps shown to people)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` in the running loop once `monotonic()` reaches `when`; a `when`
        already past runs it on the next turn."""
        ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """`call_at(monotonic() + delay, callback)`."""
        ...


class SystemClock:
    """The real clock. Its readings are the time module's functions themselves, not methods
    calling them: a keyed request reads the clock five times, and each wrapper cost a
    Python call. Timers go to the running loop as a delay, since a loop's own time need not
    be `time.monotonic` (uvloop's is libuv's, read once per turn)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(when - time.monotonic(), callback)

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ManualClock:
    """A clock that only moves when told to. `advance` steps through the timers due on the
    way, in order, with the clock reading each one's time as it runs, so a callback that
    arms another timer inside the window sees it run too; sleepers are timers as well."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_at(self._now + seconds, lambda: _wake(fut))
        try:
            await fut
        finally:
            timer.cancel()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        if when <= self._now:  # already due: on the next loop turn, as asyncio would
            try:
                asyncio.get_running_loop().call_soon(self._run_due)
            except RuntimeError:  # no loop running: the next advance runs it
                pass
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return self.call_at(self._now + delay, callback)

    @property
    def pending(self) -> list[float]:
        """When each armed timer (sleepers included) is due, soonest first."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward, running every timer due on the way (a callback's exception
        propagates: a test should see it)."""
        target = self._now + seconds
        timers = self._timers
        while timers and timers[0][0] <= target:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.cancelled = True
            timer.callback()
        self._now = max(self._now, target)

    def _run_due(self) -> None:
        self.advance(0.0)


SYSTEM_CLOCK = SystemClock()

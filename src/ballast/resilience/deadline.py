"""Deadlines on the injected clock, for I/O: `asyncio.timeout_at` runs on the loop's own time,
which a test's ManualClock cannot move, so a stalled stream or connect would wait for real.
Both keep asyncio's contract: only what runs inside the block times out, and a cancellation
from elsewhere (a client that went away) stays a cancellation."""

from __future__ import annotations

import asyncio

from ballast.resilience.clock import Clock, Timer


class Deadline:
    """`asyncio.timeout_at(when)` for the hot path, as a plain context manager with one timer
    on `clock`: TimeoutError when `when` (the clock's monotonic time) passes inside the block.
    Deadlines nest: each only converts the cancellation it caused."""

    __slots__ = ("_cancelling", "_fired", "_handle", "_task")

    def __init__(self, clock: Clock, when: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task")
        self._task = task
        self._fired = False
        self._cancelling = task.cancelling()
        self._handle = clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        self._handle.cancel()
        if self._fired and self._task.uncancel() <= self._cancelling:
            if exc_type is asyncio.CancelledError:
                raise TimeoutError


class Watchdog:
    """The clock of one stream: every wait (for the first token, then between chunks) has a
    deadline, and a wait past it ends in TimeoutError, as inside a `Deadline`. One timer
    serves all the waits: a new wait only moves the deadline (a stream of 500 chunks would
    otherwise arm and cancel 500 timers), and a timer that fires before the deadline it
    now guards re-arms itself for the rest."""

    __slots__ = ("_cancelling", "_clock", "_deadline", "_fired", "_handle", "_task", "_when")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._handle: Timer | None = None
        self._when = 0.0
        self._deadline = 0.0
        self._task: asyncio.Task[object] | None = None
        self._fired = False
        self._cancelling = 0

    def until(self, deadline: float) -> Watchdog:
        """Guard the next block with `deadline` (the clock's monotonic time)."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task")
        self._task = task
        self._deadline = deadline
        self._fired = False
        self._cancelling = task.cancelling()
        if self._handle is None or self._when > deadline:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._clock.call_at(deadline, self._fire)
            self._when = deadline
        return self

    def extend(self, deadline: float) -> None:
        """Move the guarded block's deadline while it runs (a pumped stream's next chunk came):
        no timer is touched; the armed one re-arms itself for the rest when it fires."""
        self._deadline = deadline

    def _fire(self) -> None:
        self._handle = None
        task = self._task
        if task is None:  # nobody is waiting: the next wait arms it again
            return
        if self._clock.monotonic() < self._deadline:  # the deadline moved: guard the rest
            self._handle = self._clock.call_at(self._deadline, self._fire)
            self._when = self._deadline
            return
        self._fired = True
        task.cancel()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        task, self._task = self._task, None
        if self._fired and task is not None and task.uncancel() <= self._cancelling:
            self._fired = False
            if exc_type is asyncio.CancelledError:
                raise TimeoutError

    def close(self) -> None:
        self._task = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

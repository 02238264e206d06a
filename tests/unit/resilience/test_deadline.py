"""The I/O deadline behaves as asyncio's timeout, on the injected clock: it times out only what
runs inside it, and a cancellation from elsewhere (a client that went away) stays a
cancellation. A stream's watchdog serves every wait with one timer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from ballast.resilience.clock import SYSTEM_CLOCK, ManualClock, Timer
from ballast.resilience.deadline import Deadline, Watchdog


class CountingClock(ManualClock):
    """Counts the timers armed on it."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = 0

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        self.armed += 1
        return super().call_at(when, callback)


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def no_cancellation_left() -> None:
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_wait_past_the_deadline_times_out_when_the_clock_passes_it() -> None:
    clock = ManualClock()

    async def wait() -> None:
        with Deadline(clock, clock.monotonic() + 900.0):
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(wait())
    await turns()
    clock.advance(899.0)
    await turns()
    assert not task.done()
    clock.advance(1.0)
    with pytest.raises(TimeoutError):
        await task


async def test_a_timed_out_block_leaves_no_cancellation_pending() -> None:
    clock = ManualClock()
    with pytest.raises(TimeoutError):
        with Deadline(clock, clock.monotonic() + 10.0):
            clock.advance(10.0)
            await asyncio.sleep(0)
    no_cancellation_left()
    await asyncio.sleep(0)  # would raise if a cancellation were still pending


async def test_a_deadline_already_past_times_out_at_the_first_wait() -> None:
    clock = ManualClock()
    with pytest.raises(TimeoutError):
        with Deadline(clock, clock.monotonic() - 1.0):
            await asyncio.sleep(1)
    no_cancellation_left()


async def test_a_block_that_ends_in_time_leaves_no_timer_behind() -> None:
    clock = ManualClock()
    with Deadline(clock, clock.monotonic() + 20.0):
        await asyncio.sleep(0)
    assert clock.pending == []
    clock.advance(60.0)
    await asyncio.sleep(0)  # would be cancelled here had the timer stayed armed


async def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    clock = ManualClock()
    entered = asyncio.Event()

    async def wait() -> None:
        with Deadline(clock, clock.monotonic() + 5.0):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.pending == []


async def test_a_cancellation_from_elsewhere_stays_one_when_the_deadline_fires_as_well() -> None:
    clock = ManualClock()
    entered = asyncio.Event()

    async def wait() -> None:
        with Deadline(clock, clock.monotonic() + 5.0):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await entered.wait()
    task.cancel()
    clock.advance(5.0)  # the deadline fires before the cancellation is delivered
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_nested_deadlines_each_time_out_their_own_block() -> None:
    clock = ManualClock()
    outcome: list[str] = []

    async def inner_first() -> None:
        with Deadline(clock, clock.monotonic() + 100.0):
            try:
                with Deadline(clock, clock.monotonic() + 10.0):
                    await asyncio.sleep(3600)
            except TimeoutError:
                outcome.append("inner timed out")
            await asyncio.sleep(3600)  # still under the outer deadline

    task = asyncio.ensure_future(inner_first())
    await turns()
    clock.advance(10.0)
    await turns()
    assert outcome == ["inner timed out"] and not task.done()
    clock.advance(90.0)
    with pytest.raises(TimeoutError):
        await task

    async def outer_first() -> None:
        with Deadline(clock, clock.monotonic() + 10.0):
            try:
                with Deadline(clock, clock.monotonic() + 100.0):
                    await asyncio.sleep(3600)
            except TimeoutError:
                outcome.append("the inner block took the outer's timeout")

    task = asyncio.ensure_future(outer_first())
    await turns()
    clock.advance(10.0)
    with pytest.raises(TimeoutError):
        await task
    assert outcome == ["inner timed out"]


async def test_on_the_system_clock_a_deadline_fires_on_the_monotonic_timeline() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with Deadline(SYSTEM_CLOCK, started + 0.005):
            await asyncio.sleep(5)
    assert time.monotonic() - started >= 0.005
    no_cancellation_left()


# -- a stream's watchdog: one timer for every wait --------------------------------------


async def test_waits_that_each_end_in_time_never_time_out_and_share_one_timer() -> None:
    clock = CountingClock()
    watchdog = Watchdog(clock)
    for _ in range(8):  # a chunk every 20 s against a 50 s gap: 160 s in all
        with watchdog.until(clock.monotonic() + 50.0):
            clock.advance(20.0)
            await asyncio.sleep(0)
    assert clock.armed <= 4  # re-armed only when it fired early, not once per wait
    assert len(clock.pending) == 1
    watchdog.close()
    assert clock.pending == []


async def test_a_wait_past_its_moved_deadline_times_out() -> None:
    clock = ManualClock()
    watchdog = Watchdog(clock)
    with watchdog.until(clock.monotonic() + 30.0):
        await asyncio.sleep(0)
    clock.advance(50.0)  # the timer fires with nobody waiting: nothing happens
    await asyncio.sleep(0)

    async def wait() -> None:
        with watchdog.until(clock.monotonic() + 50.0):
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(wait())
    await turns()
    clock.advance(49.0)
    await turns()
    assert not task.done()
    clock.advance(1.0)
    with pytest.raises(TimeoutError):
        await task
    watchdog.close()


async def test_a_watched_block_that_timed_out_leaves_no_cancellation_pending() -> None:
    clock = ManualClock()
    watchdog = Watchdog(clock)
    with pytest.raises(TimeoutError):
        with watchdog.until(clock.monotonic() + 10.0):
            clock.advance(10.0)
            await asyncio.sleep(0)
    no_cancellation_left()
    with watchdog.until(clock.monotonic() + 10.0):  # the next wait is guarded again
        await asyncio.sleep(0)
    watchdog.close()


async def test_a_cancellation_from_elsewhere_during_a_watched_wait_stays_one() -> None:
    clock = ManualClock()
    watchdog = Watchdog(clock)
    entered = asyncio.Event()

    async def wait() -> None:
        with watchdog.until(clock.monotonic() + 5.0):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await entered.wait()
    task.cancel()
    clock.advance(5.0)  # the deadline too, before the cancellation is delivered
    with pytest.raises(asyncio.CancelledError):
        await task
    watchdog.close()
    assert clock.pending == []


async def test_on_the_system_clock_a_watched_wait_times_out_on_time() -> None:
    watchdog = Watchdog(SYSTEM_CLOCK)
    with watchdog.until(time.monotonic() + 1.0):
        await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with watchdog.until(started + 0.005):  # sooner than the armed timer: re-armed
            await asyncio.sleep(5)
    assert 0.005 <= time.monotonic() - started < 1.0
    no_cancellation_left()
    watchdog.close()

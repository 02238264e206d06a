"""The clock's timers: a ManualClock runs them as it passes their time, the system clock on
the loop, on the monotonic timeline its readings come from."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ballast.resilience.clock import SYSTEM_CLOCK, ManualClock


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# -- the clock's own timers -----------------------------------------------------------------


async def test_advance_runs_due_timers_in_order_each_at_its_own_time() -> None:
    clock = ManualClock(start=0.0)
    seen: list[tuple[str, float]] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: seen.append((name, clock.monotonic()))

    clock.call_at(30.0, note("c"))
    clock.call_later(10.0, note("a"))
    cancelled = clock.call_at(15.0, note("never"))
    clock.call_at(20.0, lambda: (note("b")(), clock.call_later(5.0, note("armed by b"))))
    cancelled.cancel()
    clock.advance(29.0)
    assert seen == [("a", 10.0), ("b", 20.0), ("armed by b", 25.0)]
    assert clock.monotonic() == 29.0
    assert clock.pending == [30.0]
    clock.advance(1.0)
    assert seen[-1] == ("c", 30.0)
    assert clock.pending == []


async def test_a_timer_already_due_runs_on_the_next_loop_turn_without_an_advance() -> None:
    clock = ManualClock()
    ran = asyncio.Event()
    clock.call_at(clock.monotonic() - 5.0, ran.set)
    assert not ran.is_set()
    await asyncio.wait_for(ran.wait(), 1.0)


async def test_sleepers_wake_on_advance_and_a_cancelled_sleep_leaves_no_timer() -> None:
    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.sleep(60.0))
    await turns()
    clock.advance(59.0)
    await turns()
    assert not sleeper.done()
    clock.advance(1.0)
    await asyncio.wait_for(sleeper, 1.0)
    cancelled = asyncio.ensure_future(clock.sleep(60.0))
    await turns()
    cancelled.cancel()
    await turns()
    assert clock.pending == []


async def test_the_system_clock_arms_timers_on_the_monotonic_timeline() -> None:
    fired = asyncio.get_running_loop().create_future()
    when = time.monotonic() + 0.005
    SYSTEM_CLOCK.call_at(when, lambda: fired.set_result(time.monotonic()))
    assert await asyncio.wait_for(fired, 1.0) >= when
    fired = asyncio.get_running_loop().create_future()
    SYSTEM_CLOCK.call_at(time.monotonic() + 0.003, lambda: fired.set_result(1)).cancel()
    SYSTEM_CLOCK.call_later(0.005, lambda: None if fired.done() else fired.set_result(2))
    assert await asyncio.wait_for(fired, 1.0) == 2

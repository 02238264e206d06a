"""The lock-out after repeated wrong guesses: per caller, on the injected clock, bounded."""

from __future__ import annotations

from ballast.resilience.clock import ManualClock
from ballast.resilience.lockout import Lockout


def test_the_limit_th_failure_in_the_window_locks_the_caller_out() -> None:
    clock = ManualClock()
    lockout = Lockout(3, 60.0, clock)
    lockout.failed("a")
    lockout.failed("a")
    assert lockout.retry_after("a") == 0.0
    lockout.failed("a")
    assert lockout.retry_after("a") == 60.0
    assert lockout.retry_after("b") == 0.0  # per caller
    clock.advance(45)
    assert lockout.retry_after("a") == 15.0
    clock.advance(15)
    assert lockout.retry_after("a") == 0.0
    lockout.failed("a")  # a new count after the lock-out
    assert lockout.retry_after("a") == 0.0


def test_failures_spread_beyond_the_window_or_a_success_start_over() -> None:
    clock = ManualClock()
    lockout = Lockout(3, 60.0, clock)
    lockout.failed("a")
    lockout.failed("a")
    clock.advance(60)
    lockout.failed("a")
    assert lockout.retry_after("a") == 0.0
    lockout.failed("a")
    lockout.succeeded("a")
    lockout.failed("a")
    lockout.failed("a")
    assert lockout.retry_after("a") == 0.0


def test_callers_remembered_are_bounded_and_those_locked_out_kept() -> None:
    clock = ManualClock()
    lockout = Lockout(2, 60.0, clock, most=10)
    lockout.failed("locked")
    lockout.failed("locked")
    for i in range(50):
        lockout.failed(f"caller-{i}")
        assert len(lockout) <= 10
    assert lockout.retry_after("locked") == 60.0

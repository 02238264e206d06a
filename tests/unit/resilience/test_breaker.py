"""Circuit breaker: rules by example, then a stateful model check."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ballast.config.breaker import BreakerSettings, breaker_config
from ballast.resilience.breaker import (
    BreakerConfig,
    BreakerOpenError,
    BreakerState,
    CircuitBreaker,
    Permit,
)
from ballast.resilience.clock import ManualClock

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def make(**overrides: object) -> tuple[CircuitBreaker, ManualClock, list[tuple[str, str, str]]]:
    clock = ManualClock()
    seen: list[tuple[str, str, str]] = []
    cfg = BreakerConfig(**{"failure_rate": None, **overrides})  # type: ignore[arg-type]
    breaker = CircuitBreaker(
        "dep", cfg, clock, on_transition=lambda n, a, b: seen.append((n, a.value, b.value))
    )
    return breaker, clock, seen


def fail(breaker: CircuitBreaker, times: int, retry_after: float | None = None) -> None:
    for _ in range(times):
        permit = breaker.acquire()
        assert permit is not None
        breaker.record_failure(permit, retry_after)


def open_then_half_open(breaker: CircuitBreaker, clock: ManualClock) -> None:
    fail(breaker, breaker.config.failure_threshold)
    assert breaker.state is OPEN
    clock.advance(breaker.retry_after())
    assert breaker.state is HALF_OPEN


# -- closed ------------------------------------------------------------------------


def test_closed_permit_is_shared_and_allocation_free() -> None:
    breaker, _, _ = make()
    first = breaker.acquire()
    assert first is not None and not first.probe
    assert breaker.acquire() is first


def test_opens_after_consecutive_failures_and_success_resets_count() -> None:
    breaker, _, seen = make(failure_threshold=3)
    fail(breaker, 2)
    permit = breaker.acquire()
    assert permit is not None
    breaker.record_success(permit)
    fail(breaker, 2)
    assert breaker.state is CLOSED
    fail(breaker, 1)
    assert breaker.state is OPEN
    assert breaker.opened_count == 1
    assert seen == [("dep", "closed", "open")]


def test_failures_seen_elsewhere_count_toward_the_threshold() -> None:
    breaker, _, seen = make(failure_threshold=3)
    fail(breaker, 1)
    assert breaker.count_failure() is False
    permit = breaker.acquire()
    assert permit is not None
    breaker.record_success(permit)  # our own traffic works: the count starts again
    assert [breaker.count_failure(), breaker.count_failure()] == [False, False]
    assert breaker.state is CLOSED
    assert breaker.count_failure() is True
    assert breaker.state is OPEN and seen == [("dep", "closed", "open")]
    assert breaker.count_failure() is False  # an open breaker has nothing to count


def test_open_fails_fast_until_open_time_then_half_opens_lazily() -> None:
    breaker, clock, seen = make(failure_threshold=1, open_time=5.0)
    fail(breaker, 1)
    assert breaker.acquire() is None
    assert breaker.retry_after() == pytest.approx(5.0)
    clock.advance(4.9)
    assert breaker.acquire() is None
    assert breaker.retry_after() == pytest.approx(0.1)
    clock.advance(0.1)
    assert seen == [("dep", "closed", "open")]  # nothing happens until someone looks
    assert breaker.state is HALF_OPEN
    assert seen[-1] == ("dep", "open", "half_open")


def test_failure_rate_over_window_opens() -> None:
    breaker, _, _ = make(failure_threshold=100, failure_rate=0.5, window=30.0, min_calls=20)
    # Two failures, one success, repeated: never 3 in a row, but 2/3 fail.
    for i in range(18):
        permit = breaker.acquire()
        assert permit is not None
        if i % 3 == 2:
            breaker.record_success(permit)
        else:
            breaker.record_failure(permit)
    assert breaker.state is CLOSED  # 18 calls < min_calls
    fail(breaker, 2)
    assert breaker.state is OPEN


def test_default_rate_rule_does_not_open_on_a_partly_failing_deployment() -> None:
    """A deployment that fails 30 % of calls at random serves 70 %: the default rate rule
    must not open on the noise of its first calls (with `min_calls` 20 it did in about one
    run of 30, and a group of two such deployments then failed every request)."""
    rng = random.Random(7)
    opened = 0
    for _ in range(400):
        clock = ManualClock()
        breaker = CircuitBreaker("dep", breaker_config(BreakerSettings()), clock)
        for _ in range(150):
            permit = breaker.acquire()
            assert permit is not None
            if rng.random() < 0.3:
                breaker.record_failure(permit)
            else:
                breaker.record_success(permit)
            if breaker.state is not CLOSED:
                opened += 1
                break
    assert opened <= 4  # 3 of these 400 at the default; `min_calls` 20 opened 10


def test_failure_rate_forgets_old_calls() -> None:
    breaker, clock, _ = make(failure_threshold=100, failure_rate=0.5, window=30.0, min_calls=20)
    fail(breaker, 19)
    clock.advance(31.0)
    fail(breaker, 1)
    assert breaker.state is CLOSED
    assert breaker.snapshot()["window_calls"] == 1


def test_failure_rate_at_threshold_does_not_open() -> None:
    breaker, _, _ = make(failure_threshold=100, failure_rate=0.5, min_calls=20)
    for i in range(20):
        permit = breaker.acquire()
        assert permit is not None
        if i % 2:
            breaker.record_failure(permit)
        else:
            breaker.record_success(permit)
    assert breaker.state is CLOSED  # exactly 50 % is not above 50 %
    fail(breaker, 1)
    assert breaker.state is OPEN  # 11 of 21 is


# -- half-open ------------------------------------------------------------------------


def test_half_open_admits_one_probe_and_success_closes() -> None:
    breaker, clock, seen = make(failure_threshold=1)
    open_then_half_open(breaker, clock)
    probe = breaker.acquire()
    assert probe is not None and probe.probe
    assert breaker.acquire() is None
    breaker.record_success(probe)
    assert breaker.state is CLOSED
    assert seen[-1] == ("dep", "half_open", "closed")
    assert breaker.acquire() is not None


def test_probe_failure_reopens_with_growing_time_capped_and_reset_by_recovery() -> None:
    breaker, clock, _ = make(failure_threshold=1, open_time=5, open_multiplier=2, max_open_time=30)
    fail(breaker, 1)
    durations = []
    for _ in range(5):
        durations.append(breaker.retry_after())
        clock.advance(breaker.retry_after())
        probe = breaker.acquire()
        assert probe is not None
        breaker.record_failure(probe)
        assert breaker.state is OPEN
    assert durations == [5, 10, 20, 30, 30]
    clock.advance(breaker.retry_after())
    probe = breaker.acquire()
    assert probe is not None
    breaker.record_success(probe)
    fail(breaker, 1)
    assert breaker.retry_after() == 5  # full recovery reset the growth


def test_several_probes_when_configured() -> None:
    breaker, clock, _ = make(failure_threshold=1, half_open_probes=2)
    open_then_half_open(breaker, clock)
    assert breaker.acquire() is not None
    assert breaker.acquire() is not None
    assert breaker.acquire() is None
    assert breaker.snapshot()["probes_in_flight"] == 2


def test_stuck_probe_lease_expires_and_its_late_verdict_is_ignored() -> None:
    breaker, clock, _ = make(failure_threshold=1, probe_timeout=10.0)
    open_then_half_open(breaker, clock)
    stuck = breaker.acquire()
    assert stuck is not None
    clock.advance(9.9)
    assert breaker.acquire() is None
    assert breaker.retry_after() == pytest.approx(0.1)
    clock.advance(0.1)
    fresh = breaker.acquire()
    assert fresh is not None  # the stuck probe no longer blocks
    breaker.record_success(stuck)
    assert breaker.state is HALF_OPEN  # verdict for an expired lease ignored
    breaker.record_failure(stuck)
    assert breaker.state is HALF_OPEN
    breaker.record_success(fresh)
    assert breaker.state is CLOSED


def test_verdict_after_lease_expiry_is_ignored_even_if_nobody_acquired() -> None:
    breaker, clock, _ = make(failure_threshold=1, probe_timeout=10.0)
    open_then_half_open(breaker, clock)
    late = breaker.acquire()
    assert late is not None
    clock.advance(10.0)
    breaker.record_success(late)
    assert breaker.state is HALF_OPEN
    again = breaker.acquire()
    assert again is not None
    clock.advance(10.0)
    breaker.record_failure(again)
    assert breaker.state is HALF_OPEN and breaker.opened_count == 1


def test_release_frees_probe_slot_without_verdict() -> None:
    breaker, clock, _ = make(failure_threshold=1)
    open_then_half_open(breaker, clock)
    probe = breaker.acquire()
    assert probe is not None
    breaker.release(probe)
    assert breaker.state is HALF_OPEN
    again = breaker.acquire()
    assert again is not None
    breaker.record_failure(probe)  # released: no longer counts
    assert breaker.state is HALF_OPEN


def test_closed_permit_from_before_opening_is_stale_after_recovery() -> None:
    breaker, clock, _ = make(failure_threshold=2)
    old = breaker.acquire()
    assert old is not None
    open_then_half_open(breaker, clock)
    probe = breaker.acquire()
    assert probe is not None
    breaker.record_success(probe)
    for _ in range(5):
        breaker.record_failure(old)
    assert breaker.state is CLOSED
    breaker.record_success(old)  # and a late success does not close an open breaker
    fail(breaker, 2)
    breaker.record_success(old)
    assert breaker.state is OPEN


# -- Retry-After and manual control --------------------------------------------------


def test_retry_after_lengthens_open_time_up_to_cap() -> None:
    breaker, _, _ = make(failure_threshold=1, open_time=5, max_open_time=300)
    fail(breaker, 1, retry_after=42.0)
    assert breaker.retry_after() == pytest.approx(42.0)
    breaker.reset()
    fail(breaker, 1, retry_after=1.0)  # shorter than the base: base wins
    assert breaker.retry_after() == pytest.approx(5.0)
    breaker.reset()
    fail(breaker, 1, retry_after=86_400.0)
    assert breaker.retry_after() == pytest.approx(300.0)


def test_failure_while_cooling_extends_the_cooldown() -> None:
    breaker, clock, _ = make(failure_threshold=2, open_time=5)
    inflight = breaker.acquire()
    assert inflight is not None
    fail(breaker, 2)
    clock.advance(4.0)
    breaker.record_failure(inflight, retry_after=20.0)
    assert breaker.state is OPEN
    assert breaker.retry_after() == pytest.approx(20.0)
    breaker.record_failure(inflight)  # without Retry-After: no extension
    assert breaker.retry_after() == pytest.approx(20.0)
    breaker.record_failure(inflight, retry_after=1.0)  # never shortens
    assert breaker.retry_after() == pytest.approx(20.0)


def test_late_failure_of_a_live_probe_extends_but_stale_permits_do_not() -> None:
    breaker, clock, _ = make(failure_threshold=1, half_open_probes=2, open_time=5, probe_timeout=7)
    open_then_half_open(breaker, clock)
    first, second = breaker.acquire(), breaker.acquire()
    assert first is not None and second is not None
    breaker.record_failure(first)  # reopens for 10 s
    breaker.record_failure(second, retry_after=30.0)  # lease still valid: extends
    assert breaker.retry_after() == pytest.approx(30.0)

    breaker, clock, _ = make(failure_threshold=1, half_open_probes=2, open_time=5, probe_timeout=7)
    open_then_half_open(breaker, clock)
    first, second = breaker.acquire(), breaker.acquire()
    assert first is not None and second is not None
    breaker.record_failure(first)
    clock.advance(8.0)  # the second lease has expired: its verdict no longer counts
    breaker.record_failure(second, retry_after=30.0)
    assert breaker.retry_after() == pytest.approx(2.0)


def test_closed_permit_from_an_earlier_period_does_not_extend() -> None:
    breaker, clock, _ = make(failure_threshold=1, open_time=5)
    old = breaker.acquire()
    assert old is not None
    open_then_half_open(breaker, clock)
    probe = breaker.acquire()
    assert probe is not None
    breaker.record_success(probe)
    breaker.force_open(5.0)
    breaker.record_failure(old, retry_after=100.0)
    assert breaker.retry_after() == pytest.approx(5.0)


def test_force_open_and_it_never_shortens() -> None:
    breaker, clock, seen = make()
    breaker.force_open(30.0)
    assert breaker.state is OPEN and breaker.acquire() is None
    breaker.force_open(10.0)
    assert breaker.retry_after() == pytest.approx(30.0)
    breaker.force_open(60.0)
    assert breaker.retry_after() == pytest.approx(60.0)
    clock.advance(60.0)
    assert breaker.state is HALF_OPEN
    assert breaker.opened_count == 1
    assert seen == [("dep", "closed", "open"), ("dep", "open", "half_open")]


def test_reset_closes_and_clears() -> None:
    breaker, _, _ = make(failure_threshold=3)
    fail(breaker, 2)
    breaker.reset()
    fail(breaker, 2)
    assert breaker.state is CLOSED
    breaker.force_open(100.0)
    breaker.reset()
    assert breaker.state is CLOSED and breaker.retry_after() == 0.0
    assert breaker.acquire() is not None


def test_reset_forgets_the_failure_window() -> None:
    breaker, _, _ = make(failure_threshold=100, failure_rate=0.5, min_calls=20)
    fail(breaker, 19)
    breaker.reset()
    fail(breaker, 2)
    assert breaker.state is CLOSED
    assert breaker.snapshot()["window_calls"] == 2


def test_snapshot_and_repr() -> None:
    breaker, clock, _ = make(failure_threshold=2, failure_rate=0.9, open_time=5)
    fail(breaker, 2)
    snap = breaker.snapshot()
    assert snap["state"] == "open"
    assert snap["consecutive_failures"] == 2
    assert (snap["window_calls"], snap["window_failures"]) == (2, 2)
    assert snap["open_until"] == pytest.approx(clock.monotonic() + 5)
    assert snap["retry_after"] == pytest.approx(5)
    assert snap["probes_in_flight"] == 0
    assert snap["opened_count"] == 1
    assert repr(breaker) == "CircuitBreaker('dep', state=open)"


def test_transition_callback_errors_do_not_break_the_breaker() -> None:
    def boom(name: str, old: BreakerState, new: BreakerState) -> None:
        raise RuntimeError("metrics down")

    breaker = CircuitBreaker("x", BreakerConfig(failure_threshold=1), ManualClock(), boom)
    fail(breaker, 1)
    assert breaker.state is OPEN


@pytest.mark.parametrize(
    "bad",
    [
        {"failure_threshold": 0},
        {"half_open_probes": 0},
        {"failure_rate": 1.5},
        {"probe_timeout": 0},
        {"open_multiplier": 0.5},
    ],
)
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**bad)  # type: ignore[arg-type]


# -- call() --------------------------------------------------------------------------


async def test_call_returns_value_and_records_errors() -> None:
    breaker, _, _ = make(failure_threshold=2)

    async def ok() -> int:
        return 7

    async def broken() -> int:
        raise ConnectionError("refused")

    assert await breaker.call(ok, timeout=1.0) == 7
    with pytest.raises(ConnectionError):
        await breaker.call(broken, timeout=1.0)
    assert breaker.snapshot()["consecutive_failures"] == 1


async def test_call_opens_after_timeouts_then_fails_fast_without_calling() -> None:
    breaker, clock, _ = make(failure_threshold=3, open_time=5)
    calls = 0

    async def hang() -> None:
        nonlocal calls
        calls += 1
        await asyncio.Event().wait()

    for _ in range(3):  # each times out when the breaker's clock passes its bound
        task = asyncio.create_task(breaker.call(hang, timeout=2.0))
        await asyncio.sleep(0)
        clock.advance(1.9)
        await asyncio.sleep(0)
        assert not task.done()
        clock.advance(0.1)
        done, _ = await asyncio.wait([task], timeout=1.0)  # real time: a bound, never reached
        assert done and isinstance(task.exception(), TimeoutError)
    assert breaker.state is OPEN
    with pytest.raises(BreakerOpenError) as err:
        await breaker.call(hang, timeout=10.0)
    assert calls == 3
    assert err.value.retry_after == pytest.approx(5)
    assert err.value.name == "dep"


async def test_call_cancellation_releases_probe_without_verdict() -> None:
    breaker, clock, _ = make(failure_threshold=1)
    open_then_half_open(breaker, clock)
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(breaker.call(slow, timeout=60.0))
    await started.wait()
    assert breaker.acquire() is None  # the call holds the only probe
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state is HALF_OPEN
    assert breaker.acquire() is not None


# -- stateful model check ------------------------------------------------------------


class BreakerMachine(RuleBasedStateMachine):
    """Drives a breaker at random and compares it with a plain model of the rules."""

    CONFIG = BreakerConfig(
        failure_threshold=3,
        failure_rate=None,
        open_time=5.0,
        open_multiplier=2.0,
        max_open_time=40.0,
        half_open_probes=2,
        probe_timeout=7.0,
    )

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.cfg = self.CONFIG
        self.breaker = CircuitBreaker("m", self.cfg, self.clock)
        # model
        self.m_state = CLOSED
        self.m_open_until = 0.0
        self.m_next_open = self.cfg.open_time
        self.m_consecutive = 0
        self.m_epoch = 0
        self.m_opened = 0
        self.m_leases: dict[int, float] = {}  # id(permit) -> lease expiry
        self.held: list[tuple[Permit, int]] = []  # permit, closed epoch when admitted

    # model helpers
    @property
    def now(self) -> float:
        return self.clock.monotonic()

    def m_effective(self) -> BreakerState:
        if self.m_state is OPEN and self.now >= self.m_open_until:
            self.m_state = HALF_OPEN
        return self.m_state

    def m_set(self, new: BreakerState) -> None:
        if new is self.m_state:
            return
        self.m_state = new
        self.m_leases.clear()
        if new is OPEN:
            self.m_opened += 1
        if new is CLOSED:
            self.m_epoch += 1
            self.m_consecutive = 0
            self.m_next_open = self.cfg.open_time

    def m_open(self, duration: float, retry_after: float | None) -> None:
        if retry_after is not None and retry_after > 0:
            duration = max(duration, min(retry_after, self.cfg.max_open_time))
        self.m_open_until = self.now + duration
        self.m_set(OPEN)

    def m_live_leases(self) -> int:
        return sum(1 for exp in self.m_leases.values() if exp > self.now)

    # rules
    @rule()
    def acquire(self) -> None:
        state = self.m_effective()
        permit = self.breaker.acquire()
        if state is CLOSED:
            assert permit is not None and not permit.probe
        elif state is OPEN:
            assert permit is None
        elif self.m_live_leases() < self.cfg.half_open_probes:
            assert permit is not None and permit.probe
            self.m_leases = {k: v for k, v in self.m_leases.items() if v > self.now}
            self.m_leases[id(permit)] = self.now + self.cfg.probe_timeout
        else:
            assert permit is None
        if permit is not None:
            self.held.append((permit, self.m_epoch))

    def take(self, data: st.DataObject) -> tuple[Permit, int]:
        index = data.draw(st.integers(0, len(self.held) - 1))
        return self.held.pop(index)

    def m_take_lease(self, permit: Permit) -> bool:
        expiry = self.m_leases.pop(id(permit), None)
        return expiry is not None and expiry > self.now

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def success(self, data: st.DataObject) -> None:
        permit, epoch = self.take(data)
        self.m_effective()
        if permit.probe:
            if self.m_take_lease(permit):
                self.m_set(CLOSED)
        elif epoch == self.m_epoch and self.m_state is CLOSED:
            self.m_consecutive = 0
        self.breaker.record_success(permit)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry_after=st.none() | st.floats(0.0, 100.0))
    def failure(self, data: st.DataObject, retry_after: float | None) -> None:
        self.fail_permit(*self.take(data), retry_after)

    def fail_permit(self, permit: Permit, epoch: int, retry_after: float | None) -> None:
        current_closed = not permit.probe and epoch == self.m_epoch
        self.m_effective()
        if permit.probe and self.m_take_lease(permit):
            self.m_next_open = min(
                self.cfg.max_open_time, self.m_next_open * self.cfg.open_multiplier
            )
            self.m_open(self.m_next_open, retry_after)
        elif current_closed and self.m_state is CLOSED:
            self.m_consecutive += 1
            if self.m_consecutive >= self.cfg.failure_threshold:
                self.m_open(self.m_next_open, retry_after)
        elif (
            retry_after is not None
            and self.m_effective() is OPEN
            and (current_closed or (permit.probe and permit.expires_at > self.now))
        ):
            until = self.now + min(retry_after, self.cfg.max_open_time)
            self.m_open_until = max(self.m_open_until, until)
        self.breaker.record_failure(permit, retry_after)

    @rule(probe_ok=st.booleans())
    def trip_and_wait(self, probe_ok: bool) -> None:
        """Whole cycles (trip, wait out, probe) so growth and recovery get exercised."""
        while self.m_effective() is CLOSED:
            self.acquire()
            self.fail_permit(*self.held.pop(), None)
        if self.m_effective() is OPEN:
            self.clock.advance(self.m_open_until - self.now)
        if self.m_effective() is HALF_OPEN and self.m_live_leases() < self.cfg.half_open_probes:
            self.acquire()
            permit, epoch = self.held.pop()
            if probe_ok:
                self.m_take_lease(permit)
                self.m_set(CLOSED)
                self.breaker.record_success(permit)
            else:
                self.fail_permit(permit, epoch, None)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        permit, _ = self.take(data)
        self.m_leases.pop(id(permit), None)
        self.breaker.release(permit)

    @rule(seconds=st.floats(0.0, 15.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(duration=st.floats(0.0, 60.0))
    def force_open(self, duration: float) -> None:
        until = self.now + duration
        if self.m_effective() is OPEN:
            self.m_open_until = max(self.m_open_until, until)
        else:
            self.m_open_until = until
            self.m_set(OPEN)
        self.breaker.force_open(duration)

    @rule()
    def stuck_probe_never_blocks_past_probe_timeout(self) -> None:
        if self.m_effective() is not HALF_OPEN:
            return
        self.clock.advance(self.cfg.probe_timeout)
        assert self.breaker.state is HALF_OPEN
        self.acquire()
        assert self.held and self.held[-1][0].probe

    # invariants
    @invariant()
    def state_matches_model(self) -> None:
        assert self.breaker.state is self.m_effective()
        assert self.breaker.opened_count == self.m_opened
        expected = 0.0
        if self.m_state is OPEN:
            expected = self.m_open_until - self.now
        elif self.m_state is HALF_OPEN and self.m_live_leases() >= self.cfg.half_open_probes:
            expected = min(v for v in self.m_leases.values() if v > self.now) - self.now
        assert math.isclose(self.breaker.retry_after(), expected, abs_tol=1e-9)

    @invariant()
    def probes_never_exceed_limit(self) -> None:
        assert self.breaker.snapshot()["probes_in_flight"] <= self.cfg.half_open_probes

    @invariant()
    def open_never_admits(self) -> None:
        if self.breaker.state is OPEN:
            assert self.breaker.acquire() is None

    @invariant()
    def open_time_within_cap(self) -> None:
        if self.breaker.state is OPEN:
            assert self.breaker.retry_after() <= max(self.cfg.max_open_time, 60.0) + 1e-9


class SingleProbeMachine(BreakerMachine):
    CONFIG = BreakerConfig(
        failure_threshold=2,
        failure_rate=None,
        open_time=3.0,
        open_multiplier=3.0,
        max_open_time=50.0,
        half_open_probes=1,
        probe_timeout=4.0,
    )


_STATEFUL = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = _STATEFUL
TestSingleProbeMachine = SingleProbeMachine.TestCase
TestSingleProbeMachine.settings = _STATEFUL


def test_an_early_probe_closes_a_recovered_breaker_before_its_open_time() -> None:
    breaker, _, _ = make(failure_threshold=1, open_time=300.0)
    breaker.record_failure(breaker.acquire())  # type: ignore[arg-type]
    assert breaker.state is BreakerState.OPEN and breaker.acquire() is None
    early = breaker.early_probe()
    assert early is not None
    assert breaker.early_probe() is None  # one at a time
    breaker.record_success(early)
    assert breaker.state is BreakerState.CLOSED  # type: ignore[comparison-overlap]


def test_a_failed_early_probe_keeps_it_open_without_growth_and_waits_an_interval() -> None:
    breaker, clock, _ = make(failure_threshold=1, open_time=10.0, early_probe_interval=1.0)
    breaker.record_failure(breaker.acquire())  # type: ignore[arg-type]
    before = breaker.retry_after()
    early = breaker.early_probe()
    assert early is not None
    breaker.record_failure(early)
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_after() == pytest.approx(before)  # no growth, no extension
    assert breaker.early_probe() is None  # not again within the interval
    clock.advance(1.01)
    assert breaker.early_probe() is not None
    assert breaker.acquire() is None  # ordinary callers still fail fast

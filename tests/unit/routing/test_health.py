"""Deployment health: sliding window, peak EWMA, cost and the choice of deployment."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ballast.resilience.clock import ManualClock
from ballast.resilience.window import SlidingWindow
from ballast.routing.health import (
    ERROR_PENALTY,
    NEUTRAL_LATENCY,
    DeploymentHealth,
    choose,
)

# -- sliding window ------------------------------------------------------------------


def test_window_counts_and_error_rate() -> None:
    clock = ManualClock(start=0.0)
    window = SlidingWindow(window=10.0, buckets=5, clock=clock)
    assert window.totals() == (0, 0) and window.error_rate() == 0.0
    for ok in (True, True, False, True):
        window.record(ok)
    assert window.totals() == (4, 1)
    assert window.error_rate() == 0.25


def test_window_forgets_bucket_by_bucket() -> None:
    clock = ManualClock(start=0.0)
    window = SlidingWindow(window=10.0, buckets=5, clock=clock)  # 2 s buckets
    window.record(False)  # bucket [0, 2)
    clock.advance(4.0)
    window.record(True)  # bucket [4, 6)
    clock.advance(5.9)  # t = 9.9: both still inside
    assert window.totals() == (2, 1)
    clock.advance(0.1)  # t = 10: bucket [0, 2) has left
    assert window.totals() == (1, 0)
    clock.advance(6.0)  # t = 16: bucket [4, 6) has left
    assert window.totals() == (0, 0)
    clock.advance(1000.0)
    window.record(True)
    assert window.totals() == (1, 0)


class WindowMachine(RuleBasedStateMachine):
    """Totals match a naive list of timestamped events, to one bucket of granularity."""

    WINDOW, BUCKETS = 10.0, 5

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.window = SlidingWindow(self.WINDOW, self.BUCKETS, self.clock)
        self.events: list[tuple[float, bool]] = []

    @rule(ok=st.booleans(), count=st.integers(1, 3))
    def record(self, ok: bool, count: int) -> None:
        for _ in range(count):
            self.window.record(ok)
            self.events.append((self.clock.monotonic(), ok))

    @rule(seconds=st.floats(0.0, 15.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def totals_match_naive_model(self) -> None:
        now, width, eps = self.clock.monotonic(), self.WINDOW / self.BUCKETS, 1e-6

        def naive(since: float) -> tuple[int, int]:
            inside = [ok for t, ok in self.events if t > since]
            return len(inside), inside.count(False)

        calls, failures = self.window.totals()
        most_calls, most_failures = naive(now - self.WINDOW - eps)
        least_calls, least_failures = naive(now - self.WINDOW + width + eps)
        assert least_calls <= calls <= most_calls
        assert least_failures <= failures <= most_failures


TestWindowMachine = WindowMachine.TestCase
TestWindowMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


# -- deployment health ------------------------------------------------------------------


def test_peak_ewma_jumps_up_and_decays_down() -> None:
    clock = ManualClock()
    health = DeploymentHealth("a", clock, decay=10.0)
    assert health.latency is None
    health.start()
    health.finish(True, latency=1.0)
    assert health.latency == 1.0
    clock.advance(1.0)
    health.start()
    health.finish(True, latency=5.0)
    assert health.latency == 5.0  # a peak is taken at once
    clock.advance(10.0)
    health.start()
    health.finish(True, latency=1.0)
    w = math.exp(-1.0)
    assert health.latency == pytest.approx(5.0 * w + 1.0 * (1 - w))


def test_fast_failures_do_not_lower_latency() -> None:
    clock = ManualClock()
    health = DeploymentHealth("a", clock)
    health.finish(True, latency=2.0, ttft=0.5)
    clock.advance(60.0)
    health.finish(False, latency=0.001, ttft=0.001)
    assert health.latency == 2.0 and health.ttft == 0.5
    health.finish(False, latency=9.0)
    assert health.latency == 9.0


def test_ttft_ewma_follows_the_same_rule() -> None:
    clock = ManualClock()
    health = DeploymentHealth("a", clock, decay=5.0)
    health.finish(True, ttft=0.2)
    clock.advance(5.0)
    health.finish(True, ttft=0.1)
    w = math.exp(-1.0)
    assert health.ttft == pytest.approx(0.2 * w + 0.1 * (1 - w))
    assert health.latency is None


def test_in_flight_start_finish_abandon_never_negative() -> None:
    health = DeploymentHealth("a", ManualClock())
    health.start()
    health.start()
    assert health.in_flight == 2
    health.abandon()
    assert health.in_flight == 1 and health.window.totals() == (0, 0)
    health.finish(False)
    health.abandon()
    assert health.in_flight == 0 and health.window.totals() == (1, 1)


def test_cost_formula() -> None:
    health = DeploymentHealth("a", ManualClock())
    assert health.cost() == NEUTRAL_LATENCY
    assert health.cost(fallback_latency=0.3) == pytest.approx(0.3)
    for ok in (True, True, True, False):
        health.finish(ok, latency=0.5)
    health.start()
    health.start()
    expected = 0.5 * (2 + 1) * (1 + ERROR_PENALTY * 0.25)
    assert health.cost() == pytest.approx(expected)


def test_seed_starts_from_the_group_average() -> None:
    health = DeploymentHealth("new", ManualClock())
    health.seed(0.8, 0.3)
    assert health.latency == 0.8 and health.ttft == 0.3
    assert health.cost() == pytest.approx(0.8)


def test_p95_ttft_over_the_last_64_samples() -> None:
    health = DeploymentHealth("a", ManualClock())
    assert health.p95_ttft() is None
    for i in range(1, 101):
        health.finish(True, ttft=float(i))
    # last 64 samples are 37..100; nearest-rank p95 is the 61st: 97
    assert health.p95_ttft() == 97.0
    health.finish(False, ttft=1000.0)  # failed attempts do not skew the hedge delay
    assert health.p95_ttft() == 97.0


def test_snapshot() -> None:
    health = DeploymentHealth("a", ManualClock())
    health.finish(True, latency=0.5, ttft=0.1)
    snap = health.snapshot()
    assert snap["deployment_id"] == "a"
    assert (snap["calls"], snap["failures"], snap["in_flight"]) == (1, 0, 0)
    assert snap["latency"] == 0.5 and snap["ttft"] == 0.1 and snap["p95_ttft"] == 0.1
    assert snap["cost"] == pytest.approx(0.5)


# -- choose ----------------------------------------------------------------------------


def group(latencies: dict[str, float | None]) -> dict[str, DeploymentHealth]:
    clock = ManualClock()
    out = {}
    for name, lat in latencies.items():
        out[name] = DeploymentHealth(name, clock)
        if lat is not None:
            out[name].finish(True, latency=lat)
    return out


def test_ordered_keeps_configuration_order() -> None:
    hs = group({"a": 9.0, "b": 1.0, "c": 5.0})
    names = ["a", "b", "c"]
    assert choose(names, "ordered", hs.__getitem__, lambda _: 1.0, random.Random(1)) == names


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ValueError):
        choose(["a"], "fastest", lambda _: DeploymentHealth("a"), lambda _: 1.0, random.Random())


def test_health_strategy_power_of_two_then_ascending_cost() -> None:
    hs = group({"a": 3.0, "b": 1.0, "c": 2.0, "d": 4.0})
    firsts: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(600):
        order = choose(list(hs), "health", hs.__getitem__, lambda _: 1.0, rng)
        assert sorted(order) == ["a", "b", "c", "d"]
        rest = order[1:]
        assert rest == sorted(rest, key=lambda n: hs[n].cost())
        firsts[order[0]] += 1
    assert firsts["d"] == 0  # the worst loses every pair
    # b wins every pair it is in (1/2); a wins only against d (1/6).
    assert firsts["b"] == pytest.approx(300, abs=60)
    assert firsts["a"] == pytest.approx(100, abs=40)


def test_errors_push_a_fast_deployment_back() -> None:
    hs = group({"fast": 1.0, "slow": 2.0})
    hs["fast"].finish(False)  # 1 of 2 fails: cost x (1 + 10 x 0.5)
    order = choose(["fast", "slow"], "health", hs.__getitem__, lambda _: 1.0, random.Random(0))
    assert order == ["slow", "fast"]


def test_new_deployment_counts_as_average_not_zero() -> None:
    hs = group({"a": 1.0, "b": 3.0, "new": None})
    firsts: Counter[str] = Counter()
    rng = random.Random(3)
    for _ in range(600):
        order = choose(list(hs), "health", hs.__getitem__, lambda _: 1.0, rng)
        firsts[order[0]] += 1
        assert order[1:] in (["new", "b"], ["a", "b"], ["a", "new"])
    # as the average (2.0) "new" wins only the pair with b: 1/3, not 2/3 as a zero would
    assert firsts["new"] == pytest.approx(200, abs=50)
    assert firsts["a"] == pytest.approx(400, abs=50)


def test_weighted_follows_weights_and_puts_zero_last() -> None:
    weights = {"a": 3.0, "b": 1.0, "off": 0.0, "off2": 0.0}
    firsts: Counter[str] = Counter()
    rng = random.Random(11)
    for _ in range(2000):
        order = choose(
            list(weights), "weighted", lambda _: DeploymentHealth("x"), weights.__getitem__, rng
        )
        assert order[2:] == ["off", "off2"]
        firsts[order[0]] += 1
    assert firsts["a"] / 2000 == pytest.approx(0.75, abs=0.04)


def test_single_candidate_and_empty() -> None:
    hs = group({"a": 1.0})
    for strategy in ("health", "ordered", "weighted"):
        assert choose(["a"], strategy, hs.__getitem__, lambda _: 1.0, random.Random()) == ["a"]
        assert choose([], strategy, hs.__getitem__, lambda _: 1.0, random.Random()) == []


def test_a_deployment_that_lost_every_pair_is_tried_again_once_its_figure_is_old() -> None:
    clock = ManualClock()
    fast = DeploymentHealth("fast", clock)
    slow = DeploymentHealth("slow", clock)
    for h, latency in ((fast, 0.1), (slow, 0.5)):
        h.start()
        h.finish(True, latency=latency)
    hs = {"fast": fast, "slow": slow}
    rng = random.Random(1)

    def first() -> str:
        order = choose(["fast", "slow"], "health", hs.__getitem__, lambda _: 1.0, rng)
        return order[0]

    assert first() == "fast"
    clock.advance(5)  # "fast" keeps answering; "slow" is not asked, so its figure ages
    fast.start()
    fast.finish(True, latency=0.1)
    assert first() == "fast"
    clock.advance(6)  # past the average's decay: worth one request to learn where it stands
    fast.start()
    fast.finish(True, latency=0.1)
    assert first() == "slow"
    slow.start()  # that request is in flight: no second exploration meanwhile
    assert first() == "fast"
    slow.finish(True, latency=0.05)  # it has become faster: its figure follows
    assert slow.latency is not None and slow.latency < 0.5
    assert not slow.stale(clock.monotonic())

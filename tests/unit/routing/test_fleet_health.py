"""Workers that tell each other of their deployments' health, on the manual clock: a dead
deployment costs the fleet `failure_threshold` failures, not that many per worker; a
cooldown or an open breaker seen by one holds every other one; a recovery closes them all;
nothing a worker hears is told back. The workers here are linked by a loopback in place of
Redis (tests/integration/test_upstream_health.py runs the real one)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from ballast.config import StateSettings, parse_settings
from ballast.resilience import failures
from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import ManualClock
from ballast.resilience.failures import Failure
from ballast.routing.fleet_health import FleetHealth
from ballast.routing.router import Router
from ballast.routing.targets import Target
from ballast.state.store import RedisStore
from ballast.state.upstream_health import SharedHealth, Verdict

HOLD = 10.0
OPEN, CLOSED = BreakerState.OPEN, BreakerState.CLOSED
SETTINGS = parse_settings(
    {
        "routing": {"breaker": {"failure_threshold": 3, "failure_rate": None, "open_time": 5}},
        "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9/v1"}]}],
    }
)


class Loopback(SharedHealth):
    """Hands each verdict told to every other worker at once, as Redis would, and keeps
    them for the test to read."""

    def __init__(self, name: str, clock: ManualClock, everyone: list[Loopback]) -> None:
        super().__init__(RedisStore("redis://127.0.0.1:9/0", StateSettings()), "", clock, name)
        self.everyone = everyone
        self.told: list[Verdict] = []
        self.subscribed = True
        everyone.append(self)

    def tell(self, verdict: Verdict) -> None:
        self.told.append(verdict)
        for other in self.everyone:
            if other is not self:
                other.listener(verdict)


@dataclass
class Worker:
    router: Router
    shared: Loopback

    @property
    def target(self) -> Target:
        return self.router.targets["a"]

    def fail(
        self, kind: failures.Kind = failures.SERVER_ERROR, retry_after: float | None = None
    ) -> None:
        permit = self.target.breaker.acquire()
        assert permit is not None, "a closed breaker admits"
        failure = Failure(kind, "x", retry_after=retry_after)
        self.router.loop.verdicts.judge(self.target, permit, failure)

    def told(self) -> list[str]:
        return [v.kind for v in self.shared.told]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def workers(clock: ManualClock) -> list[Worker]:
    everyone: list[Loopback] = []
    out = []
    for n in range(3):
        shared = Loopback(f"w{n}", clock, everyone)
        routers: list[Router] = []

        def targets(routers: list[Router] = routers) -> dict[str, Target]:
            return routers[0].targets

        health = FleetHealth(shared, clock, targets, HOLD)
        routers.append(Router(SETTINGS, clock, random.Random(n), fleet_health=health))
        out.append(Worker(routers[0], shared))
    return out


def test_a_dead_deployment_costs_the_fleet_the_threshold_not_that_per_worker(
    workers: list[Worker],
) -> None:
    one, two, three = workers
    one.fail()
    two.fail()
    assert all(w.target.breaker.state is CLOSED for w in workers)
    three.fail()  # the third failure in all
    assert all(w.target.breaker.state is OPEN for w in workers)
    # A failure that opens the breaker is told as the opening alone.
    assert three.told() == ["open"] and one.told() == two.told() == ["failed"]


def test_a_success_of_its_own_keeps_a_worker_counting_from_zero(workers: list[Worker]) -> None:
    one, two, three = workers
    one.fail()
    one.fail()
    permit = two.target.breaker.acquire()
    assert permit is not None
    two.target.breaker.record_success(permit)  # the deployment answers this worker
    counts = [w.target.breaker.snapshot()["consecutive_failures"] for w in workers]
    assert counts == [2, 0, 2]  # its own traffic decides for it
    three.fail()
    assert all(w.target.breaker.state is OPEN for w in workers)  # an opening is shared


def test_a_cooldown_seen_by_one_holds_every_worker_and_ends_by_itself(
    workers: list[Worker], clock: ManualClock
) -> None:
    one, two, three = workers
    one.fail(failures.RATE_LIMITED, retry_after=20)
    for worker in (two, three):
        assert worker.target.cooling_until == pytest.approx(clock.monotonic() + 20)
        assert worker.target.breaker.retry_after() == pytest.approx(20 + HOLD)
        assert worker.told() == []  # what a worker hears it does not tell again
    assert one.told() == ["open"] and one.shared.told[0].cool_for == pytest.approx(20)
    clock.advance(20 + HOLD)
    assert two.target.breaker.state is BreakerState.HALF_OPEN  # expired: on its own again


def test_the_first_worker_probes_first_and_its_recovery_closes_every_breaker(
    workers: list[Worker], clock: ManualClock
) -> None:
    one, two, _ = workers
    for _ in range(3):
        one.fail()
    clock.advance(5)
    assert one.target.breaker.state is BreakerState.HALF_OPEN
    assert two.target.breaker.state is OPEN  # held for the first worker's word
    permit = one.target.breaker.acquire()
    assert permit is not None and permit.probe
    one.target.breaker.record_success(permit)
    assert all(w.target.breaker.state is CLOSED for w in workers)
    assert one.told() == ["failed", "failed", "open", "closed"]


def test_a_failed_probe_holds_the_others_for_the_longer_open_time(
    workers: list[Worker], clock: ManualClock
) -> None:
    one, two, _ = workers
    for _ in range(3):
        one.fail()
    clock.advance(5)
    permit = one.target.breaker.acquire()
    assert permit is not None
    one.target.breaker.record_failure(permit)  # open again, for twice as long
    assert one.shared.told[-1].open_for == pytest.approx(10)
    assert two.target.breaker.retry_after() == pytest.approx(10 + HOLD)


def test_a_drain_is_kept_for_later_instances_and_applied_when_read(workers: list[Worker]) -> None:
    one, two, _ = workers
    health = one.router.fleet_health
    assert health is not None
    health.drained("a", True)
    assert one.told() == ["drain"]
    assert two.target.drained  # as an instance that reads it at its start
    health.drained("a", False)
    assert not two.target.drained


def test_a_failed_background_probe_holds_every_breaker_past_the_next_probe(
    workers: list[Worker], clock: ManualClock
) -> None:
    one, two, _ = workers
    for _ in range(3):
        one.fail()
    health = two.router.fleet_health
    assert health is not None
    clock.advance(4)
    health.probe_failed(two.target, 2.0)  # two holds the fleet's probe lease
    assert two.target.breaker.retry_after() == pytest.approx(2 + HOLD)
    assert one.target.breaker.retry_after() == pytest.approx(2 + 2 * HOLD)
    clock.advance(2)
    assert one.target.breaker.state is OPEN  # its own open time is over: no live trial
    two.shared.subscribed = False  # Redis out of reach: on its own again
    health.probe_failed(two.target, 2.0)
    assert two.target.breaker.retry_after() == pytest.approx(HOLD)

"""A fleet on one machine, counted at the simulator: Ballast instances of two workers each
behind nginx, sharing Redis and PostgreSQL, learn an upstream's health together.

- A deployment answering 429 with `Retry-After: 20` is sent at most one request per instance
  while the cooldown runs (each worker alone would send one, and again after each local
  cooldown).
- A dead deployment costs the fleet at most `failure_threshold` + instances failed attempts
  before every worker stops sending it (alone: the threshold on each worker).
- Its recovery is found by one probe at a time across the fleet, and every worker of every
  instance is back on it within 2 s of the first probe that succeeded.
- One instance killed with -9 under load costs the clients no more than the requests it
  had in flight; nginx sends the rest to the others.

Three instances of two workers: six workers, their supervisors, nginx, the simulators,
Redis and PostgreSQL on two cores start in about 15 s, and the scenarios take about 5 s more.
Real time is short here (the cooldown is measured over a second or two of traffic, the
breaker's times are seconds); the fleet's processes keep their own clocks."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ballast.server.serving import balances_reuse_port
from tests.fleet import (
    LATENCY,
    THRESHOLD,
    Machine,
    Upstreams,
    cooldown_attempts,
    dead_attempts,
    fleet_config,
    from_clients,
    load,
    machine,
    settle,
)
from tests.stack import Stack, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT"),
]

INSTANCES = 3


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    stack = Stack()
    try:
        yield Upstreams(stack)
    finally:
        stack.close()


@pytest.fixture(scope="module")
def fleet(
    upstreams: Upstreams,
    redis_url: str,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Machine]:
    folder: Path = tmp_path_factory.mktemp("fleet")
    config = fleet_config(upstreams, redis_url, database_url)
    with machine(folder, config, INSTANCES) as running:
        yield running


def test_a_cooldown_is_kept_by_the_whole_fleet(fleet: Machine, upstreams: Upstreams) -> None:
    started = time.time()
    statuses, sent = cooldown_attempts(fleet, upstreams)
    assert statuses == [200] * len(statuses)  # the spare answered
    took = time.time() - started
    assert 1 <= sent <= INSTANCES, (sent, took)
    assert took < 20  # all of it inside the cooldown
    assert set(fleet.breakers(upstreams.ids["limited"])) == {"open"}


def test_a_dead_deployment_then_its_recovery(fleet: Machine, upstreams: Upstreams) -> None:
    dead = upstreams.ids["dead"]
    statuses, failed = dead_attempts(fleet, upstreams)
    assert statuses == [200] * len(statuses)
    assert THRESHOLD <= failed <= THRESHOLD + INSTANCES, failed
    wait_for(lambda: set(fleet.breakers(dead)) == {"open"}, timeout=2)

    # Probes from here on; each takes a while, so two at once would overlap.
    upstreams.stack.set_behaviour(upstreams.dead, f"500?latency={LATENCY}")
    settle(1.5)  # a few of them, all failing
    upstreams.stack.set_behaviour(upstreams.dead, f"ok?tokens=1&latency={LATENCY}")
    wait_for(lambda: set(fleet.breakers(dead)) == {"closed"}, timeout=10)
    all_back = time.time()

    attempts = upstreams.attempts(upstreams.dead)
    probes = [a for a in attempts if a not in from_clients(attempts)]
    assert len(probes) >= 2
    starts = sorted(a["time"] for a in probes)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= LATENCY * 0.9, gaps  # one probe at a time across the fleet
    first_ok = min(a["time"] for a in probes if a["outcome"] == "ok")
    assert all_back - first_ok < 2.0
    assert load(fleet.port, "dead", 8) == [200] * 8
    answered = from_clients(upstreams.attempts(upstreams.dead))
    assert len(answered) >= failed + 8  # every instance sends it traffic again


def test_an_instance_killed_under_load_costs_only_its_requests_in_flight(fleet: Machine) -> None:
    """Last in this module: the fleet has one instance less afterwards."""
    concurrency = 4
    with ThreadPoolExecutor(1) as background:
        running = background.submit(load, fleet.port, "steady", 120, concurrency, 0.02)
        settle(0.5)
        fleet.kill(len(fleet.ports) - 1)
        statuses = running.result(timeout=60)
    failed = [s for s in statuses if s != 200]
    assert len(failed) <= concurrency, failed  # at most the requests in flight at the kill
    assert len(statuses) - len(failed) > 100
    assert load(fleet.port, "steady", 12) == [200] * 12  # the others serve everything

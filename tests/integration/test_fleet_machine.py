"""A fleet on one machine, counted at the simulator: Ballast instances of two workers each
behind nginx, sharing Redis and PostgreSQL, learn an upstream's health together.

- A deployment answering 429 with `Retry-After: 20` is sent at most one request per instance
  while the cooldown runs (each worker alone would send one, and again after each local
  cooldown).
- A dead deployment costs the fleet at most `failure_threshold` + instances failed attempts
  before every worker stops sending it (alone: the threshold on each worker).
- Its recovery is found by one probe at a time across the fleet, and every worker of every
  instance is back on it within 2 s of the first probe that succeeded.

Three instances of two workers: six workers, their supervisors, nginx, the simulators,
Redis and PostgreSQL on two cores start in about 15 s, and the scenarios take about 5 s more.
Real time is short here (the cooldown is measured over a second or two of traffic, the
breaker's times are seconds); the fleet's processes keep their own clocks."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ballast.server.serving import balances_reuse_port
from ballast.sim.server import SimServer
from tests.fleet import Machine, machine, request, settle
from tests.stack import Stack, deployment, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT"),
]

INSTANCES = 3
THRESHOLD = 3
LATENCY = 0.2  # each answer of the broken deployment takes this long: overlaps would show
_ids = itertools.count()


class Upstreams:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.limited = stack.sim("429?retry_after=20", name="limited")
        self.dead = stack.sim("500", name="dead")
        self.healthy = stack.sim("ok?tokens=2", name="healthy")
        # Deployment ids of this run's own: what the fleet shares outlives it in Redis.
        run = uuid.uuid4().hex[:8]
        self.ids = {name: f"{name}-{run}" for name in ("limited", "dead", "spare-1", "spare-2")}

    def attempts(self, sim: SimServer) -> list[dict[str, Any]]:
        return self.stack.attempts(sim)


def fleet_config(up: Upstreams, redis_url: str, database_url: str) -> dict[str, Any]:
    def ordered(name: str, sim: SimServer, spare: str) -> dict[str, Any]:
        first = deployment(up.ids[name], sim, "m")
        spare_dep = deployment(up.ids[spare], up.healthy, "m")
        return {"name": name, "strategy": "ordered", "deployments": [first, spare_dep]}

    return {
        "server": {"master_key": "sk-fleet-master-0123456789"},
        "state": {"redis_url": redis_url, "database_url": database_url},
        "routing": {
            "max_retry_after_wait": 0,
            "breaker": {
                "failure_threshold": THRESHOLD,
                "failure_rate": None,
                "open_time": 2,
                "probe_interval": 0.5,
                "max_probe_interval": 0.5,
                "probe_timeout": 2,
            },
        },
        "models": [
            ordered("limited", up.limited, "spare-1"),
            ordered("dead", up.dead, "spare-2"),
        ],
    }


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
    with machine(folder, fleet_config(upstreams, redis_url, database_url), INSTANCES) as running:
        yield running


def load(port: int, model: str, count: int, concurrency: int = 4, pause: float = 0.1) -> list[int]:
    """`count` chat requests through nginx from `concurrency` clients, each pausing `pause`
    after each answer, their starts spread over one pause: traffic that reaches every worker,
    without all of it in flight at the moment of the first verdict (requests already sent
    then are bounded by the concurrency, not by what the fleet shares). Their statuses. Each
    carries a request id, which the simulator logs: the attempts without one are probes."""

    def client(k: int) -> list[int]:
        time.sleep(k * pause / concurrency)
        statuses = []
        for _ in range(k, count, concurrency):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            rid = {"x-request-id": f"client-{next(_ids)}"}
            statuses.append(request(port, "POST", "/v1/chat/completions", body, rid)[0])
            time.sleep(pause)
        return statuses

    with ThreadPoolExecutor(concurrency) as pool:
        return [s for statuses in pool.map(client, range(concurrency)) for s in statuses]


def from_clients(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in attempts if str(a["headers"].get("x-request-id", "")).startswith("client-")]


def test_a_cooldown_is_kept_by_the_whole_fleet(fleet: Machine, upstreams: Upstreams) -> None:
    started = time.time()
    statuses = load(fleet.port, "limited", 40)
    assert statuses == [200] * 40  # the spare answered
    took = time.time() - started
    sent = upstreams.attempts(upstreams.limited)
    assert 1 <= len(sent) <= INSTANCES, (len(sent), took)
    assert took < 20  # all of it inside the cooldown
    assert set(fleet.breakers(upstreams.ids["limited"])) == {"open"}


def test_a_dead_deployment_then_its_recovery(fleet: Machine, upstreams: Upstreams) -> None:
    dead = upstreams.ids["dead"]
    statuses = load(fleet.port, "dead", 30)
    assert statuses == [200] * 30
    failed = from_clients(upstreams.attempts(upstreams.dead))
    assert THRESHOLD <= len(failed) <= THRESHOLD + INSTANCES, len(failed)
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
    assert len(answered) >= len(failed) + 8  # every instance sends it traffic again

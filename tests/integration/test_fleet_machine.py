"""A fleet on one machine, counted at the simulator: Ballast instances of two workers each
behind nginx, sharing Redis and PostgreSQL, learn an upstream's health together.

- A deployment answering 429 with `Retry-After: 20` is sent at most one request per instance
  while the cooldown runs (each worker alone would send one, and again after each local
  cooldown).
- A dead deployment costs the fleet at most `failure_threshold` + instances failed attempts
  before every worker stops sending it (alone: the threshold on each worker).
- Its recovery is found by one probe at a time across the fleet, and every worker of every
  instance is back on it within 2 s of the first probe that succeeded.
- Redis blackholed under load (Redis sits behind a fault proxy here): no request waits
  longer than the Redis call timeout beyond its usual time, the database sees no stampede
  (a bounded number of statements a second, not one a request), and health sharing resumes
  within seconds of Redis coming back.
- One instance killed with -9 under load costs the clients no more than the requests it
  had in flight; nginx sends the rest to the others. Started again, it bills every answer
  it gave from its journal, and the budget it had reserved lapses within its grants' time.

Three instances of two workers: six workers, their supervisors, nginx, the simulators,
Redis and PostgreSQL on two cores start in about 15 s, and the scenarios take about 5 s more.
Real time is short here (the cooldown is measured over a second or two of traffic, the
breaker's times are seconds); the fleet's processes keep their own clocks."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from ballast.server.serving import balances_reuse_port
from tests.faultproxy import FaultProxy
from tests.fleet import (
    LATENCY,
    REDIS_TIMEOUT,
    REQUEST_TIMEOUT,
    THRESHOLD,
    Machine,
    Upstreams,
    cooldown_attempts,
    create_key,
    dead_attempts,
    fleet_config,
    from_clients,
    load,
    machine,
    settle,
)
from tests.integration.test_spend_crash_pg import _billed as billed
from tests.stack import Stack, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT"),
]

INSTANCES = 3
WORKERS = INSTANCES * 2
FLUSH_INTERVAL = 1.0  # state.spend_flush_interval's default


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    stack = Stack()
    try:
        yield Upstreams(stack)
    finally:
        stack.close()


@pytest.fixture(scope="module")
def redis_proxy(upstreams: Upstreams, redis_url: str) -> Iterator[tuple[FaultProxy, str]]:
    """The fleet reaches Redis through a fault proxy: (the proxy, the fleet's Redis URL)."""
    parsed = urlparse(redis_url)
    proxy = FaultProxy(parsed.hostname or "127.0.0.1", parsed.port or 6379)
    port = upstreams.stack.thread.run(proxy.start())
    try:
        yield proxy, f"redis://127.0.0.1:{port}{parsed.path or '/0'}"
    finally:
        upstreams.stack.thread.run(proxy.close())


@pytest.fixture(scope="module")
def fleet(
    upstreams: Upstreams,
    redis_proxy: tuple[FaultProxy, str],
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Machine]:
    folder: Path = tmp_path_factory.mktemp("fleet")
    config = fleet_config(upstreams, redis_proxy[1], database_url)
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


def test_redis_blackholed_under_load_then_back(
    fleet: Machine, upstreams: Upstreams, redis_proxy: tuple[FaultProxy, str]
) -> None:
    proxy, _ = redis_proxy
    loop = upstreams.stack.thread.loop
    key, _ = create_key(fleet.port)
    usual: list[float] = []
    assert load(fleet.port, "steady", 60, 4, 0.02, key, usual) == [200] * 60  # all know it
    before, started = fleet.statements(), time.monotonic()
    assert load(fleet.port, "steady", 160, 4, 0.02, key) == [200] * 160
    up = fleet.statements() - before
    print(f"redis up: 160 requests, {up} statements in {time.monotonic() - started:.1f} s")
    before, started = fleet.statements(), time.monotonic()

    loop.call_soon_threadsafe(proxy.blackhole)
    took: list[float] = []
    statuses = load(fleet.port, "steady", 160, 4, 0.02, key, took)
    window = time.monotonic() - started
    statements = fleet.statements() - before
    assert statuses == [200] * len(statuses)
    # No request waits on Redis longer than one call's timeout beyond what a request took
    # with Redis there (a request's further calls take their fallbacks at once).
    worst_usual = max(usual)
    assert max(took) < worst_usual + REDIS_TIMEOUT + 0.1, (max(took), worst_usual)
    # The database: each worker's spend flush (a few statements a second, whether Redis is
    # there or not) and a key lookup, never a query a request.
    bound = WORKERS * (3 * (window / FLUSH_INTERVAL + 1) + 2)
    print(
        f"blackhole: {len(took)} requests in {window:.1f} s, {statements} statements "
        f"(bound {bound:.0f}), slowest {max(took):.3f} s (usual {worst_usual:.3f} s)"
    )
    assert statements <= bound, (statements, bound)

    loop.call_soon_threadsafe(proxy.passthrough)
    back = time.monotonic()
    wait_for(lambda: all(w["health_shared"] for p in fleet.ports for w in fleet.workers(p)), 10)
    resumed = time.monotonic() - back
    print(f"health sharing resumed {resumed:.1f} s after Redis came back")
    assert resumed < 5
    statuses, sent = cooldown_attempts(fleet, upstreams, "limited-later")
    assert statuses == [200] * len(statuses)
    assert 1 <= sent <= INSTANCES, sent


def test_an_instance_killed_under_load_costs_only_its_requests_in_flight(
    fleet: Machine, redis_url: str, database_url: str
) -> None:
    """Last in this module: the instance killed is started again at the end."""
    concurrency = 4
    key, key_id = create_key(fleet.port)
    victim = len(fleet.ports) - 1
    with ThreadPoolExecutor(1) as background:
        running = background.submit(load, fleet.port, "steady", 120, concurrency, 0.02, key)
        settle(0.5)
        fleet.kill(victim)
        killed = time.time()
        statuses = running.result(timeout=60)
    failed = [s for s in statuses if s != 200]
    assert len(failed) <= concurrency, failed  # at most the requests in flight at the kill
    assert len(statuses) - len(failed) > 100
    assert load(fleet.port, "steady", 12, key=key) == [200] * 12  # the others serve everything

    # Its reservations lapse within their grants' time (the others hand theirs back idle).
    held = redis.Redis.from_url(redis_url)
    until = next(iter(held.scan_iter(f"ballast:budget:{key_id}:*:until")))
    lapse = 1.0 + REQUEST_TIMEOUT + 0.5  # grant_accept_for + request timeout + lapse margin
    scores: list[tuple[bytes, float]] = held.zrange(until, 0, -1, withscores=True)  # type: ignore[assignment]
    assert all(score <= killed + lapse + 1 for _, score in scores)
    settle(max(0.0, killed + lapse + 0.2 - time.time()))
    assert held.zrangebyscore(until, time.time(), "+inf") == []
    for probe in held.scan_iter("ballast:probe:*"):
        assert 0 < held.pttl(probe) <= 2_000 + 500  # a probe's lease: its timeout at most

    # Started again, it replays its journal: every answer the clients got is billed once.
    fleet.restart(victim)
    answered = statuses.count(200) + 12
    wait_for(lambda: _billed(database_url, key_id)[0] >= answered, timeout=10)
    events, distinct = _billed(database_url, key_id)
    assert events == distinct  # nothing billed twice
    assert events <= answered + concurrency  # at most the in-flight ones the clients lost


def _billed(database_url: str, key_id: str) -> tuple[int, int]:
    """(spend events, distinct ones) recorded for the key."""
    return asyncio.run(billed(database_url, key_id))

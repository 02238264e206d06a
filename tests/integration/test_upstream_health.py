"""Shared upstream health on a real Redis: a verdict told by one worker reaches another well
within a second, one that starts later reads the verdicts still running (and not the ones
that ran out), a worker does not hear itself, and without Redis nothing is sent or waited
for."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ballast.config import StateSettings
from ballast.resilience.clock import SYSTEM_CLOCK
from ballast.sim.server import SimServer
from ballast.state.store import RedisStore
from ballast.state.upstream_health import CLOSED, DRAINED_NOW, FAILED, OPENED, SharedHealth, Verdict
from tests.e2e.test_fleet import _within
from tests.integration.test_state_resilience import MASTER, proxy_for
from tests.integration.test_state_resilience import config as resilience_config
from tests.stack import Gateway, Stack, deployment, group, wait_for

pytestmark = pytest.mark.integration


class Worker:
    def __init__(self, redis_url: str, name: str, deployments: list[str]) -> None:
        self.store = RedisStore(redis_url, StateSettings(redis_timeout=1.0))
        self.shared = SharedHealth(self.store, redis_url, SYSTEM_CLOCK, name, resubscribe=0.1)
        self.heard: list[Verdict] = []
        self.shared.listener = self.heard.append
        self.shared.deployments = lambda: deployments

    async def started(self) -> Worker:
        self.shared.start()
        await until(lambda: self.shared.subscribed)
        return self

    async def close(self) -> None:
        await self.shared.close()
        await self.store.close()


async def until(condition: object, within: float = 3.0) -> float:
    """Seconds until `condition()` held (fails past `within`)."""
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - start < within
        await asyncio.sleep(0.005)
    return time.monotonic() - start


@pytest.fixture
def dep() -> str:
    return f"dep-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def pair(redis_url: str, dep: str) -> AsyncIterator[tuple[Worker, Worker]]:
    one = await Worker(redis_url, "one", [dep]).started()
    two = await Worker(redis_url, "two", [dep]).started()
    yield one, two
    await one.close()
    await two.close()


async def test_a_verdict_reaches_the_other_worker_within_a_second(
    pair: tuple[Worker, Worker], dep: str
) -> None:
    one, two = pair
    one.shared.tell(Verdict(dep, FAILED, origin="one"))
    one.shared.tell(Verdict(dep, OPENED, 5.0, 2.0, origin="one"))
    took = await until(lambda: len(two.heard) == 2)
    assert took < 1.0
    assert [v.kind for v in two.heard] == [FAILED, OPENED] and two.heard[1].cool_for == 2.0
    await asyncio.sleep(0.05)
    assert one.heard == []  # its own verdicts come back on the channel and are skipped


async def test_a_worker_that_starts_later_reads_what_still_runs(
    redis_url: str, pair: tuple[Worker, Worker], dep: str
) -> None:
    one, _ = pair
    one.shared.tell(Verdict(dep, OPENED, 30.0, 20.0, origin="one"))
    one.shared.tell(Verdict(dep, OPENED, 2.0, 0.0, origin="one"))  # shorter: cuts nothing short
    one.shared.tell(Verdict(f"{dep}-gone", OPENED, 0.05, 0.05, origin="one"))
    one.shared.tell(Verdict(dep, DRAINED_NOW, origin="one"))
    await until(lambda: one.shared.sent == 4)
    await asyncio.sleep(0.1)  # the short verdict runs out meanwhile
    late = await Worker(redis_url, "late", [dep, f"{dep}-gone"]).started()
    try:
        await until(lambda: len(late.heard) >= 2)
        drained = [v for v in late.heard if v.kind == DRAINED_NOW and v.deployment == dep]
        opened = [v for v in late.heard if v.kind == OPENED]
        assert drained and [v.deployment for v in opened] == [dep]
        assert 29.0 < opened[0].open_for <= 30.0 and 19.0 < opened[0].cool_for <= 20.0
        one.shared.tell(Verdict(dep, CLOSED, origin="one"))
        await until(lambda: any(v.kind == CLOSED for v in late.heard))
        assert not [v for v in await late.shared.current([dep]) if v.kind == OPENED]
    finally:
        await late.close()
        await one.store.client.srem("ballast:drained", dep)


async def test_without_redis_verdicts_are_dropped_at_no_cost(dep: str) -> None:
    worker = Worker("redis://127.0.0.1:9/0", "alone", [dep])
    worker.shared.start()
    try:
        for _ in range(10):  # the first calls fail, the Redis breaker opens
            worker.shared.tell(Verdict(dep, FAILED, origin="alone"))
            await asyncio.sleep(0.02)
        assert not worker.store.healthy
        calls = worker.store.calls
        worker.shared.tell(Verdict(dep, FAILED, origin="alone"))
        await asyncio.sleep(0.05)
        assert worker.store.calls == calls and worker.shared.sent == 0
        assert await worker.shared.current([dep]) == []
    finally:
        await worker.close()


def gateway_config(
    sim: SimServer, tmp_path: Path, name: str, redis: str, models: list[dict[str, Any]]
) -> dict[str, Any]:
    config = resilience_config(sim, tmp_path, name, redis_url=redis)
    config["models"] = models
    config["routing"] = {"max_retry_after_wait": 0}
    return config


def chat(gateway: Gateway, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def test_with_redis_blackholed_each_gateway_goes_alone_and_sharing_resumes(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    """Two gateways sharing a Redis behind a fault proxy. Blackholed: a cooldown one of them
    sees stays its own, and its request waits for nothing. Back: the next one is shared at
    once."""
    proxy, port = proxy_for(stack, redis_url)
    limited, other, spare = stack.sim(), stack.sim(), stack.sim()
    run = uuid.uuid4().hex[:8]
    a, c = f"a-{run}", f"c-{run}"

    def ordered(name: str, dep: str, sim: SimServer) -> dict[str, Any]:
        first, second = deployment(dep, sim, "m"), deployment(f"{dep}-spare", spare, "m")
        return group(name, first, second, strategy="ordered")

    models = [ordered("first", a, limited), ordered("second", c, other)]
    redis = f"redis://127.0.0.1:{port}/0"
    one, two = (stack.gateway(gateway_config(spare, tmp_path, n, redis, models)) for n in "12")

    def sharing() -> bool:
        return all(g.app.fleet_health and g.app.fleet_health.shared.connected for g in (one, two))

    wait_for(sharing, timeout=10)
    stack.thread.loop.call_soon_threadsafe(proxy.blackhole)
    stack.set_behaviour(limited, "429?retry_after=20")
    started = time.monotonic()
    assert chat(one, "first") == 200  # the spare answered
    assert time.monotonic() - started < 1.0
    assert one.router.targets[a].breaker.state.value == "open"
    time.sleep(0.5)
    assert two.router.targets[a].breaker.state.value == "closed"  # alone: not heard

    stack.thread.loop.call_soon_threadsafe(proxy.passthrough)
    wait_for(sharing, timeout=10)
    stack.set_behaviour(other, "429?retry_after=20")
    assert chat(two, "second") == 200
    took = _within(lambda: one.router.targets[c].breaker.state.value == "open", 2.0)
    assert took < 1.0

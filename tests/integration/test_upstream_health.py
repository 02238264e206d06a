"""Shared upstream health on a real Redis: a verdict told by one worker reaches another well
within a second, one that starts later reads the verdicts still running (and not the ones
that ran out), a worker does not hear itself, and without Redis nothing is sent or waited
for."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from ballast.config import StateSettings
from ballast.resilience.clock import SYSTEM_CLOCK
from ballast.state.store import RedisStore
from ballast.state.upstream_health import CLOSED, DRAINED_NOW, FAILED, OPENED, SharedHealth, Verdict

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

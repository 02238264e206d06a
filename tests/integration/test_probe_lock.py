"""One background probe per deployment at a time, and per interval, across gateways sharing
a Redis: a lease that lasts while the probe runs, ends with its interval, and frees itself
after its bound when the holder never finishes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from ballast.config import StateSettings
from ballast.state.probes import ProbeLock
from ballast.state.store import RedisStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def locks(redis_url: str) -> AsyncIterator[list[ProbeLock]]:
    stores = [RedisStore(redis_url, StateSettings(redis_timeout=1.0)) for _ in range(2)]
    yield [ProbeLock(store, bound=0.6) for store in stores]
    for store in stores:
        await store.close()


async def test_two_gateways_share_one_probe_per_interval(locks: list[ProbeLock]) -> None:
    deployment = f"dep-{uuid.uuid4().hex}"
    taken = [await lock.take(deployment, 0.3) for lock in locks]
    assert taken == [True, False]  # the other gateway's probe covers this interval
    assert await locks[1].take(f"{deployment}-other", 0.3)  # each deployment has its own
    await locks[0].done(deployment, 0.3, took=0.01)  # a quick probe: the interval still holds
    assert not await locks[1].take(deployment, 0.3)
    await asyncio.sleep(0.35)
    taken = [await lock.take(deployment, 0.3) for lock in reversed(locks)]
    assert taken == [True, False]


async def test_a_probe_longer_than_its_interval_keeps_the_lease(locks: list[ProbeLock]) -> None:
    deployment = f"dep-{uuid.uuid4().hex}"
    assert await locks[0].take(deployment, 0.1)
    await asyncio.sleep(0.25)  # the probe is still waiting for its answer
    assert not await locks[1].take(deployment, 0.1)  # one probe at a time, not one per interval
    await locks[0].done(deployment, 0.1, took=0.25)
    await asyncio.sleep(0.02)
    assert await locks[1].take(deployment, 0.1)


async def test_a_probe_that_never_ends_frees_the_lease_after_its_bound(
    locks: list[ProbeLock],
) -> None:
    deployment = f"dep-{uuid.uuid4().hex}"
    assert await locks[0].take(deployment, 0.1)  # and its holder is never heard of again
    assert not await locks[1].take(deployment, 0.1)
    await asyncio.sleep(0.65)
    assert await locks[1].take(deployment, 0.1)
    await locks[0].done(deployment, 0.1, took=0.7)  # a late end does not cut another's lease
    assert not await locks[0].take(deployment, 0.1)


async def test_without_redis_each_gateway_probes_on_its_own() -> None:
    store = RedisStore("redis://127.0.0.1:9/0", StateSettings(redis_timeout=0.05))
    lock = ProbeLock(store)
    try:
        assert await lock.take("dep", 0.3)
        assert await lock.take("dep", 0.3)  # Redis is an optimisation here, never a blocker
    finally:
        await store.close()

"""One background probe per deployment and interval across gateways sharing a Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ballast.config import StateSettings
from ballast.state.probes import ProbeLock
from ballast.state.store import RedisStore

pytestmark = pytest.mark.integration


async def test_two_gateways_share_one_probe_per_interval(redis_url: str) -> None:
    stores = [RedisStore(redis_url, StateSettings()) for _ in range(2)]
    locks = [ProbeLock(store) for store in stores]
    deployment = f"dep-{uuid.uuid4().hex}"
    try:
        taken = [await lock(deployment, 0.3) for lock in locks]
        assert taken == [True, False]  # the other gateway's probe covers this interval
        assert await locks[1](f"{deployment}-other", 0.3)  # each deployment has its own
        await asyncio.sleep(0.35)
        taken = [await lock(deployment, 0.3) for lock in reversed(locks)]
        assert taken == [True, False]
    finally:
        for store in stores:
            await store.close()


async def test_without_redis_each_gateway_probes_on_its_own() -> None:
    store = RedisStore("redis://127.0.0.1:9/0", StateSettings(redis_timeout=0.05))
    lock = ProbeLock(store)
    try:
        assert await lock("dep", 0.3)
        assert await lock("dep", 0.3)  # Redis is an optimisation here, never a blocker
    finally:
        await store.close()

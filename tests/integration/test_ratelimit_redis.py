"""Rate limits shared through a real Redis by two gateways, and what happens when Redis is
blackholed or slow (a TCP fault proxy in between): the breaker opens after a few failed
calls, each gateway falls back to its share at no cost, and one probe brings Redis back."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as redis

from ballast.config import RedisBreakerSettings, StateSettings
from ballast.resilience.breaker import BreakerState
from ballast.state.ratelimit import Lease, Limits, RateLimited, RateLimiter
from ballast.state.store import RedisStore
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

RECOVERY = 0.3  # seconds the breaker stays open before its probe


def settings(url: str, timeout: float) -> StateSettings:
    return StateSettings(
        redis_url=url,
        instances=2,
        redis_timeout=timeout,
        redis_breaker=RedisBreakerSettings(
            failure_threshold=5, recovery_timeout=RECOVERY, probe_timeout=1.0
        ),
    )


def new_key() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def keys(redis_url: str) -> AsyncIterator[list[str]]:
    """Key ids a test used; their Redis keys are deleted afterwards (no flushdb: the
    test Redis may be shared)."""
    used: list[str] = []
    yield used
    client = redis.Redis.from_url(redis_url)
    try:
        for key_id in used:
            await client.delete(f"ballast:rl:{{{key_id}}}", f"ballast:rl:{{{key_id}}}:p")
    finally:
        await client.aclose()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    target = urlsplit(redis_url)
    async with FaultProxy(target.hostname or "127.0.0.1", target.port or 6379) as running:
        yield running


def via(redis_url: str, port: int) -> str:
    parts = urlsplit(redis_url)
    return parts._replace(netloc=f"127.0.0.1:{port}").geturl()


async def gateways(
    url: str, call_timeout: float = 0.05, **kw: float
) -> AsyncIterator[tuple[RateLimiter, RateLimiter]]:
    """Two gateways, each with its own Redis client and breaker (the default 50 ms
    timeout), on one Redis."""
    stores = [RedisStore(url, settings(url, call_timeout)) for _ in range(2)]
    try:
        yield (
            RateLimiter(stores[0], instances=2, **kw),  # type: ignore[arg-type]
            RateLimiter(stores[1], instances=2, **kw),  # type: ignore[arg-type]
        )
    finally:
        for store in stores:
            await store.close()


def store_of(limiter: RateLimiter) -> RedisStore:
    store = limiter._store
    assert store is not None
    return store


async def try_acquire(limiter: RateLimiter, limits: Limits, tokens: int = 0) -> Lease | None:
    try:
        return await limiter.acquire(limits, tokens)
    except RateLimited:
        return None


# -- shared limits -------------------------------------------------------------------


async def test_two_gateways_share_one_rpm_limit_exactly(redis_url: str, keys: list[str]) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=60, tpm=None, max_parallel=None)
    # This is about atomicity, not timeouts: a cold burst of 32 new connections can miss
    # 50 ms on a busy machine and rightly fall back to the local shares.
    async for a, b in gateways(redis_url, call_timeout=2.0):
        for g in (a, b):
            await g.warm()

        # 16 concurrent workers per gateway, 5 attempts each: 160 attempts at once.
        async def worker(limiter: RateLimiter) -> list[Lease | None]:
            return [await try_acquire(limiter, limits) for _ in range(5)]

        results = await asyncio.gather(*(worker(g) for g in (a, b) for _ in range(16)))
        admitted = [lease for batch in results for lease in batch if lease is not None]
        assert a.fallbacks == b.fallbacks == 0  # every decision was Redis's
        assert len(admitted) == 60
        assert all(lease.shared for lease in admitted)
        with pytest.raises(RateLimited) as info:
            await b.acquire(limits, 0)
        refusal = info.value
        assert refusal.reason == "requests"
        assert 0 < refusal.retry_after <= 120
        assert (b"x-ratelimit-limit-requests", b"60") in refusal.headers
        assert (b"x-ratelimit-remaining-requests", b"0") in refusal.headers


async def test_tokens_reconcile_across_gateways(redis_url: str, keys: list[str]) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=1000, max_parallel=None)
    async for a, b in gateways(redis_url):
        lease = await a.acquire(limits, 600)
        assert (b"x-ratelimit-remaining-tokens", b"400") in lease.headers
        with pytest.raises(RateLimited) as info:
            await b.acquire(limits, 500)
        assert info.value.reason == "tokens"
        await a.release(lease, 100)  # 500 of the estimate come back, for everyone
        await b.acquire(limits, 500)
        with pytest.raises(RateLimited):
            await a.acquire(limits, 401)


async def test_parallel_slots_are_shared_and_a_crashed_gateways_slots_expire(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=None, max_parallel=2)
    async for a, b in gateways(redis_url, lease_ttl=0.3):
        await a.acquire(limits, 0)
        held = await b.acquire(limits, 0)
        with pytest.raises(RateLimited) as info:
            await b.acquire(limits, 0)
        assert info.value.reason == "parallel"
        await b.release(held, None)
        await b.acquire(limits, 0)
        # `a` "crashes" holding its slot, and so does `b`; both expire on their own.
        with pytest.raises(RateLimited):
            await b.acquire(limits, 0)
        await asyncio.sleep(0.35)
        await b.acquire(limits, 0)
        await b.acquire(limits, 0)


async def test_a_release_that_missed_redis_is_applied_by_the_next_acquire(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=None, max_parallel=1)
    async for a, _ in gateways(redis_url):
        lease = await a.acquire(limits, 0)
        store_of(a).breaker.force_open(RECOVERY)
        await a.release(lease, None)  # fails fast; the slot is remembered
        await asyncio.sleep(RECOVERY + 0.05)
        again = await a.acquire(limits, 0)  # the probe carries the missed release
        assert again.shared
        assert store_of(a).breaker.state is BreakerState.CLOSED


async def test_a_finished_request_costs_no_round_trip_of_its_own(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=1000, max_parallel=1)
    async for a, b in gateways(redis_url, release_delay=0.2):
        first = await a.acquire(limits, 600)
        calls = store_of(a).calls
        a.release_soon(first, 100)  # deferred: nothing sent yet
        assert store_of(a).calls == calls
        # The next acquire carries the release: its slot is free and 500 tokens are back.
        second = await a.acquire(limits, 500)
        assert store_of(a).calls == calls + 1
        assert (b"x-ratelimit-remaining-tokens", b"400") in second.headers
        # No acquire follows this one: the flush sends it within release_delay, for everyone.
        a.release_soon(second, 500)
        with pytest.raises(RateLimited) as info:
            await b.acquire(limits, 0)
        assert info.value.reason == "parallel"
        await asyncio.sleep(0.3)
        third = await b.acquire(limits, 0)
        assert (b"x-ratelimit-remaining-tokens", b"400") in third.headers
        # Shutdown sends what is still deferred.
        b.release_soon(third, 300)
        await b.close()
        assert await a.acquire(limits, 0)


async def test_an_acquire_counts_after_its_keys_releases_in_flight(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=None, max_parallel=1)
    async for a, _ in gateways(redis_url, call_timeout=1.0, release_delay=10.0):
        for _ in range(20):
            lease = await a.acquire(limits, 0)
            a.release_soon(lease, None)
            flushing = asyncio.ensure_future(a.flush())
            await asyncio.sleep(0)  # the flush has taken the release and is sending it
            again = await a.acquire(limits, 0)  # must not overtake it: the slot is free
            await flushing
            a.release_soon(again, None)
            await a.flush()


async def test_concurrent_acquires_share_round_trips_and_stay_exact(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=50, tpm=None, max_parallel=None)
    async for a, _ in gateways(redis_url, call_timeout=1.0):
        calls = store_of(a).calls
        got = await asyncio.gather(*(try_acquire(a, limits) for _ in range(80)))
        assert sum(lease is not None for lease in got) == 50  # exact, as one by one
        assert all(lease.shared for lease in got if lease is not None)
        assert store_of(a).calls - calls < 10  # one pipeline per turn of the loop
        assert a.fallbacks == 0


async def test_one_script_call_per_key_judges_its_acquires_in_order(
    redis_url: str, keys: list[str]
) -> None:
    tokens_key, slots_key = new_key(), new_key()
    keys += [tokens_key, slots_key]
    tokens = Limits(tokens_key, rpm=None, tpm=100, max_parallel=None)
    slots = Limits(slots_key, rpm=None, tpm=None, max_parallel=2)
    async for a, _ in gateways(redis_url, call_timeout=1.0):
        calls = store_of(a).calls
        got = await asyncio.gather(
            try_acquire(a, tokens, 30),
            try_acquire(a, slots),
            try_acquire(a, tokens, 50),
            try_acquire(a, slots),
            try_acquire(a, tokens, 40),  # 120 > 100: refused
            try_acquire(a, slots),  # a third slot: refused
            try_acquire(a, tokens, 20),  # 100: fits after the refusal
        )
        assert store_of(a).calls - calls == 1  # both keys' batches in one round trip
        assert [lease is not None for lease in got] == [True, True, True, True, False, False, True]
        third = got[2]
        assert third is not None
        assert dict(third.headers)[b"x-ratelimit-remaining-tokens"] == b"20"  # after 30 + 50
        assert a.fallbacks == 0


async def test_an_acquire_abandoned_in_flight_gives_its_slot_back(
    redis_url: str, keys: list[str]
) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=None, tpm=None, max_parallel=1)
    async for a, b in gateways(redis_url, call_timeout=1.0, release_delay=0.05):
        waiting = asyncio.ensure_future(a.acquire(limits, 0))
        await asyncio.sleep(0)  # queued for this turn's pipeline, which Redis will grant
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0.2)  # the grant came back to nobody and was released
        assert await try_acquire(b, limits) is not None


async def test_scripts_flushed_from_redis_are_loaded_again(redis_url: str, keys: list[str]) -> None:
    key = new_key()
    keys.append(key)
    limits = Limits(key, rpm=100, tpm=None, max_parallel=None)
    async for a, _ in gateways(redis_url, call_timeout=1.0):
        await a.acquire(limits, 0)
        client = redis.Redis.from_url(redis_url)
        try:
            await client.script_flush()
        finally:
            await client.aclose()
        leases = await asyncio.gather(a.acquire(limits, 0), a.acquire(limits, 0))
        assert all(lease.shared for lease in leases)
        assert (await a.acquire(limits, 0)).shared
        assert a.fallbacks == 0


# -- Redis misbehaving ------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["blackhole", "slow"])
async def test_bad_redis_opens_the_breaker_falls_back_to_shares_and_recovers(
    redis_url: str, proxy: FaultProxy, keys: list[str], fault: str
) -> None:
    warm, key = new_key(), new_key()
    keys.extend([warm, key])
    limits = Limits(key, rpm=60, tpm=None, max_parallel=None)
    async for a, b in gateways(via(redis_url, proxy.port)):
        for g in (a, b):  # connected, scripts loaded, Redis used
            assert (await g.acquire(Limits(warm, 60, None, None), 0)).shared

        if fault == "blackhole":
            proxy.blackhole()
        else:
            proxy.delay(30.0)

        for g in (a, b):
            store = store_of(g)
            admitted = 0
            calls_before = store.calls
            calls_when_open: int | None = None
            slowest_before_open = slowest_after_open = 0.0
            accepted_when_open = 0
            for _ in range(40):
                started = time.perf_counter()
                lease = await try_acquire(g, limits)
                took = time.perf_counter() - started
                admitted += lease is not None
                assert lease is None or not lease.shared
                if calls_when_open is not None:
                    slowest_after_open = max(slowest_after_open, took)
                    continue
                slowest_before_open = max(slowest_before_open, took)
                if store.breaker.state is BreakerState.OPEN:
                    calls_when_open = store.calls
                    accepted_when_open = proxy.accepted
            assert calls_when_open is not None and calls_when_open - calls_before <= 5
            assert slowest_before_open < 0.5  # each failed call is bounded by its timeout
            assert slowest_after_open < 0.005
            assert proxy.accepted == accepted_when_open  # open: no new connections at all
            assert admitted == 30  # this gateway's share of 60

        proxy.passthrough()
        await asyncio.sleep(RECOVERY + 0.05)
        for g in (a, b):
            store = store_of(g)
            assert store.breaker.state is BreakerState.HALF_OPEN
            before = store.calls
            lease = await g.acquire(Limits(warm, 60, None, None), 0)
            assert lease.shared  # the probe went to Redis and worked...
            assert store.calls == before + 1
            assert store.healthy  # ...and closed the breaker
            assert store.breaker.opened_count == 1

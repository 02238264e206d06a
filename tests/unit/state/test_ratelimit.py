"""The local rate limiter (no Redis, or Redis unusable), on a manual clock."""

from __future__ import annotations

import pytest

from ballast.config import RedisBreakerSettings, StateSettings
from ballast.resilience.clock import ManualClock
from ballast.state.ratelimit import (
    Lease,
    Limits,
    RateLimited,
    RateLimiter,
    reset_header,
)
from ballast.state.store import RedisStore

WINDOW_START = 60.0 * 1000  # a window boundary on the manual clock


def make(instances: int = 1) -> tuple[RateLimiter, ManualClock]:
    clock = ManualClock(start=WINDOW_START)
    return RateLimiter(None, instances=instances, clock=clock), clock


def limits(
    rpm: int | None = None, tpm: int | None = None, par: int | None = None, key: str = "k1"
) -> Limits:
    return Limits(key, rpm, tpm, par)


async def admit(limiter: RateLimiter, lim: Limits, n: int, tokens: int = 0) -> list[Lease]:
    return [await limiter.acquire(lim, tokens) for _ in range(n)]


async def refused(limiter: RateLimiter, lim: Limits, tokens: int = 0) -> RateLimited:
    with pytest.raises(RateLimited) as info:
        await limiter.acquire(lim, tokens)
    return info.value


def header(lease_or_error: Lease | RateLimited, name: str) -> str | None:
    for k, v in lease_or_error.headers:
        if k == name.encode():
            return v.decode()
    return None


# -- requests per minute -------------------------------------------------------------


async def test_rpm_admits_the_limit_then_refuses_until_the_window_slides() -> None:
    limiter, clock = make()
    lim = limits(rpm=5)
    await admit(limiter, lim, 5)
    err = await refused(limiter, lim)
    assert err.reason == "requests"
    # 5 in this window: the next one fits when 4/5 of them have aged out of the last
    # minute: 60 s to the next window plus 12 s into it.
    assert err.retry_after == pytest.approx(72.0)
    clock.advance(71.9)
    await refused(limiter, lim)
    clock.advance(0.1)
    await limiter.acquire(lim, 0)
    await refused(limiter, lim)


async def test_previous_window_counts_by_its_overlap_with_the_last_minute() -> None:
    limiter, clock = make()
    lim = limits(rpm=10)
    await admit(limiter, lim, 10)
    clock.advance(60 + 30)  # half of the previous window still overlaps: 5 used
    await admit(limiter, lim, 5)
    err = await refused(limiter, lim)
    assert err.reason == "requests"
    clock.advance(30)  # next window's start: the 5 are fully weighted, the 10 gone
    await admit(limiter, lim, 5)
    await refused(limiter, lim)
    clock.advance(30)  # halfway: 5 * 0.5 + 5 = 7.5 used, room for 2 more
    await admit(limiter, lim, 2)
    await refused(limiter, lim)


async def test_a_burst_across_a_window_boundary_gets_no_extra_requests() -> None:
    limiter, clock = make()
    lim = limits(rpm=60)
    clock.advance(59.9)
    await admit(limiter, lim, 60)
    clock.advance(0.2)  # just into the next window
    await refused(limiter, lim)


async def test_limits_are_per_key() -> None:
    limiter, _ = make()
    await admit(limiter, limits(rpm=1, key="a"), 1)
    await refused(limiter, limits(rpm=1, key="a"))
    await limiter.acquire(limits(rpm=1, key="b"), 0)


async def test_zero_refuses_everything() -> None:
    limiter, _ = make()
    assert (await refused(limiter, limits(rpm=0))).retry_after == 60.0
    assert (await refused(limiter, limits(tpm=0), tokens=1)).reason == "tokens"
    assert (await refused(limiter, limits(par=0))).reason == "parallel"


# -- tokens per minute -----------------------------------------------------------------


async def test_tpm_books_the_estimate_and_reconciles_down() -> None:
    limiter, _ = make()
    lim = limits(tpm=1000)
    first = await limiter.acquire(lim, 600)
    err = await refused(limiter, lim, tokens=500)
    assert err.reason == "tokens"
    await limiter.release(first, 100)  # used far less than estimated: 500 back
    await limiter.acquire(lim, 500)
    await refused(limiter, lim, tokens=401)
    await limiter.acquire(lim, 400)


async def test_tpm_reconciles_up_and_none_keeps_the_estimate() -> None:
    limiter, _ = make()
    lim = limits(tpm=1000)
    lease = await limiter.acquire(lim, 100)
    await limiter.release(lease, 1000)  # the estimate was far too low
    await refused(limiter, lim, tokens=1)
    limiter2, _ = make()
    lease = await limiter2.acquire(lim, 400)
    await limiter2.release(lease, None)  # no usage reported: the estimate stands
    await refused(limiter2, lim, tokens=601)
    await limiter2.acquire(lim, 600)


async def test_reconcile_after_the_window_rolled_goes_to_the_previous_window() -> None:
    limiter, clock = make()
    lim = limits(tpm=1000)
    lease = await limiter.acquire(lim, 1000)
    clock.advance(60)  # previous window fully weighted: all 1000 still count
    await refused(limiter, lim, tokens=1)
    await limiter.release(lease, 0)
    await limiter.acquire(lim, 1000)


async def test_an_estimate_larger_than_the_limit_needs_an_empty_window() -> None:
    limiter, clock = make()
    lim = limits(tpm=100)
    await limiter.acquire(lim, 500)  # could never fit otherwise; books all 500
    err = await refused(limiter, lim, tokens=500)
    assert err.reason == "tokens"
    clock.advance(err.retry_after)
    await limiter.acquire(lim, 500)


async def test_tpm_retry_after_is_exact() -> None:
    limiter, clock = make()
    lim = limits(tpm=1000)
    await limiter.acquire(lim, 1000)
    clock.advance(60)
    err = await refused(limiter, lim, tokens=250)
    assert err.retry_after == pytest.approx(15.0)  # 1000 * (45/60) + 250 = 1000
    clock.advance(14.9)
    await refused(limiter, lim, tokens=250)
    clock.advance(0.1)
    await limiter.acquire(lim, 250)


# -- parallel requests -------------------------------------------------------------------


async def test_parallel_slots_come_back_on_release_once() -> None:
    limiter, _ = make()
    lim = limits(par=2)
    a, _b = await admit(limiter, lim, 2)
    err = await refused(limiter, lim)
    assert err.reason == "parallel" and err.retry_after > 0
    await limiter.release(a, None)
    await limiter.release(a, None)  # a second release must not free a second slot
    c = await limiter.acquire(lim, 0)
    await refused(limiter, lim)
    await limiter.release(c, None)
    await limiter.acquire(lim, 0)


async def test_a_local_release_soon_frees_the_slot_at_once() -> None:
    limiter, _ = make()
    lim = limits(par=1, tpm=1000)
    lease = await limiter.acquire(lim, 600)
    limiter.release_soon(lease, 100)
    limiter.release_soon(lease, 100)  # once only
    again = await limiter.acquire(lim, 0)
    assert (b"x-ratelimit-remaining-tokens", b"900") in again.headers


async def test_parallel_is_checked_before_and_independent_of_rpm() -> None:
    limiter, _ = make()
    lim = limits(rpm=3, par=1)
    lease = await limiter.acquire(lim, 0)
    assert (await refused(limiter, lim)).reason == "parallel"
    await limiter.release(lease, None)
    await admit(limiter, lim, 1)
    assert (await refused(limiter, lim)).reason == "parallel"


# -- shares per instance ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instances", "limit", "share"), [(2, 60, 30), (3, 10, 4), (4, 1, 1), (1, 7, 7)]
)
async def test_each_instance_enforces_its_share_rounded_up(
    instances: int, limit: int, share: int
) -> None:
    limiter, _ = make(instances)
    lim = limits(rpm=limit)
    leases = await admit(limiter, lim, share)
    await refused(limiter, lim)
    assert header(leases[0], "x-ratelimit-limit-requests") == str(share)


async def test_shares_apply_to_tokens_and_parallel_too() -> None:
    limiter, _ = make(instances=2)
    await limiter.acquire(limits(tpm=1000, key="t"), 500)
    await refused(limiter, limits(tpm=1000, key="t"), tokens=1)
    await admit(limiter, limits(par=5, key="p"), 3)
    await refused(limiter, limits(par=5, key="p"))


# -- headers ----------------------------------------------------------------------------


async def test_openai_headers_only_for_limits_that_apply() -> None:
    limiter, clock = make()
    clock.advance(15)
    lease = await limiter.acquire(limits(rpm=60, tpm=1000), 100)
    assert lease.headers == [
        (b"x-ratelimit-limit-requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"59"),
        (b"x-ratelimit-reset-requests", b"1m45s"),
        (b"x-ratelimit-limit-tokens", b"1000"),
        (b"x-ratelimit-remaining-tokens", b"900"),
        (b"x-ratelimit-reset-tokens", b"1m45s"),
    ]
    lease = await limiter.acquire(limits(tpm=10, key="other"), 1)
    assert [k for k, _ in lease.headers] == [
        b"x-ratelimit-limit-tokens",
        b"x-ratelimit-remaining-tokens",
        b"x-ratelimit-reset-tokens",
    ]
    assert (await limiter.acquire(limits(par=1, key="p"), 0)).headers == []


async def test_refusal_carries_headers_with_nothing_remaining() -> None:
    limiter, _ = make()
    lim = limits(rpm=2)
    await admit(limiter, lim, 2)
    err = await refused(limiter, lim)
    assert header(err, "x-ratelimit-remaining-requests") == "0"
    assert header(err, "x-ratelimit-limit-requests") == "2"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.0004, "1ms"), (0.25, "250ms"), (1.5, "1.5s"), (6, "6s"), (90, "1m30s"),
     (120, "2m0s"), (61.25, "1m1.25s")],
)  # fmt: skip
def test_durations_look_like_openais(seconds: float, text: str) -> None:
    assert reset_header(seconds) == text.encode()


# -- no limits, and a Redis that cannot answer -------------------------------------------


def unreachable_store(clock: ManualClock) -> RedisStore:
    settings = StateSettings(redis_breaker=RedisBreakerSettings(failure_threshold=3))
    return RedisStore("redis://127.0.0.1:1/0", settings, clock)  # nothing listens on port 1


async def test_a_key_without_limits_never_touches_redis() -> None:
    clock = ManualClock(start=WINDOW_START)
    store = unreachable_store(clock)
    limiter = RateLimiter(store, clock=clock)
    try:
        lease = await limiter.acquire(limits(), 10_000)
        assert lease.headers == []
        await limiter.release(lease, 5)
        assert store.calls == 0
    finally:
        await store.close()


async def test_unreachable_redis_falls_back_to_the_share_and_stops_calling() -> None:
    clock = ManualClock(start=WINDOW_START)
    store = unreachable_store(clock)
    limiter = RateLimiter(store, instances=2, clock=clock)
    lim = limits(rpm=10, par=100)
    try:
        leases = await admit(limiter, lim, 5)  # each one failed over to the local limiter
        assert not any(lease.shared for lease in leases)
        assert store.breaker.state.value == "open"
        calls = store.calls
        await refused(limiter, lim)  # share of 10 over 2 instances: 5
        for lease in leases:
            await limiter.release(lease, None)  # local leases: no Redis involved
        assert store.calls == calls  # open: Redis is not even asked
        assert limiter.fallbacks == 6
    finally:
        await store.close()


async def test_acquire_now_decides_locally_and_defers_to_redis_while_it_can_answer() -> None:
    clock = ManualClock(start=WINDOW_START)
    local = RateLimiter(None, clock=clock)
    lim = limits(rpm=1)
    lease = local.acquire_now(lim, 0)
    assert lease is not None and not lease.shared
    with pytest.raises(RateLimited):
        local.acquire_now(lim, 0)  # the same window as `acquire`
    store = unreachable_store(clock)
    limiter = RateLimiter(store, clock=clock)
    try:
        assert limiter.acquire_now(lim, 0) is None  # closed breaker: Redis is asked
        assert store.calls == 0
        await admit(limiter, limits(rpm=10, key="k2"), 3)  # three failures open the breaker
        assert store.breaker.state.value == "open"
        fallback = limiter.acquire_now(lim, 0)
        assert fallback is not None and not fallback.shared
        assert limiter.fallbacks == 4
    finally:
        await store.close()


def test_the_counted_instances_never_go_below_the_configured_number() -> None:
    limiter = RateLimiter(None, instances=2)
    limiter.set_instances(1)  # counted while the other was still starting
    assert limiter.instances == 2
    limiter.set_instances(3)  # autoscaled: each enforces a third while Redis is down
    assert limiter.instances == 3

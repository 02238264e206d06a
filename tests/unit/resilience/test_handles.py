"""The handle cache: single-flight, compare-and-delete, refresh ahead of expiry, backoff."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ballast.resilience.clock import ManualClock
from ballast.resilience.handles import Handle, HandleCache, HandleUnavailable, Key

KEY: Key = ("cred", "model")


class FakeActor:
    """Creates runs; can be told to fail, and to hold creations until released."""

    def __init__(self, clock: ManualClock, ttl: float = 3600.0) -> None:
        self.clock = clock
        self.ttl = ttl
        self.ids = itertools.count(1)
        self.created: list[Handle] = []
        self.released: list[str] = []
        self.sessions_seen: list[str | None] = []
        self.fail = False
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate: asyncio.Event | None = None

    async def create(self, key: Key, session_id: str | None) -> Handle:
        self.sessions_seen.append(session_id)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            if self.fail:
                raise ConnectionError("actor down")
            n = next(self.ids)
            handle = Handle(
                session_id or "sess-1",
                f"run-{n}",
                f"http://actor/runs/run-{n}/v1",
                f"token-{n}",
                self.clock.time() + self.ttl,
            )
            self.created.append(handle)
            return handle
        finally:
            self.in_flight -= 1

    async def release(self, handle: Handle) -> None:
        self.released.append(handle.run_id)


def make(clock: ManualClock, actor: FakeActor, margin: float = 60.0) -> HandleCache:
    return HandleCache(
        actor.create,
        actor.release,
        clock,
        refresh_margin=margin,
        failure_backoff=1.0,
        max_failure_backoff=8.0,
    )


async def test_get_creates_once_and_reuses() -> None:
    clock = ManualClock()
    actor = FakeActor(clock)
    cache = make(clock, actor)
    first = await cache.get(KEY)
    assert await cache.get(KEY) is first
    assert len(actor.created) == 1


async def test_concurrent_replacements_make_exactly_one_run() -> None:
    clock = ManualClock()
    actor = FakeActor(clock)
    cache = make(clock, actor)
    stale = await cache.get(KEY)
    actor.gate = asyncio.Event()
    waiters = [asyncio.create_task(cache.replace(KEY, stale)) for _ in range(50)]
    await asyncio.sleep(0.01)
    actor.gate.set()
    handles = await asyncio.gather(*waiters)
    assert len(actor.created) == 2
    assert all(h is handles[0] for h in handles)
    assert handles[0] is not stale
    assert actor.sessions_seen[-1] == stale.session_id  # the service session is reused
    await asyncio.sleep(0)
    assert actor.released == [stale.run_id]


async def test_replace_keeps_a_fresh_handle_made_by_someone_else() -> None:
    clock = ManualClock()
    actor = FakeActor(clock)
    cache = make(clock, actor)
    stale = await cache.get(KEY)
    fresh = await cache.replace(KEY, stale)
    # A late request still holding the stale handle must not throw the fresh one away.
    assert await cache.replace(KEY, stale) is fresh
    assert len(actor.created) == 2
    assert cache.stats.healed == 1


async def test_token_is_refreshed_ahead_of_expiry() -> None:
    clock = ManualClock()
    actor = FakeActor(clock, ttl=120.0)
    cache = make(clock, actor, margin=30.0)
    first = await cache.get(KEY)
    clock.advance(80)
    assert await cache.get(KEY) is first
    clock.advance(15)  # 25 s left, inside the margin
    second = await cache.get(KEY)
    assert second is not first and second.expires_at > clock.time() + 30
    assert cache.stats.refreshed == 1


async def test_failed_creation_leaves_nothing_stale_and_backs_off() -> None:
    clock = ManualClock()
    actor = FakeActor(clock)
    cache = make(clock, actor)
    stale = await cache.get(KEY)
    actor.fail = True
    with pytest.raises(HandleUnavailable):
        await cache.replace(KEY, stale)
    assert cache.peek(KEY) is None
    calls = len(actor.sessions_seen)
    with pytest.raises(HandleUnavailable) as info:
        await cache.get(KEY)
    assert len(actor.sessions_seen) == calls  # backing off: the actor is not asked again
    assert 0 < info.value.retry_after <= 1.0
    actor.fail = False
    clock.advance(1.01)
    handle = await cache.get(KEY)
    assert handle.session_id == stale.session_id


class HandleCacheMachine(RuleBasedStateMachine):
    """No interleaving of expiry, 409s, concurrency and failures leaves a stale handle in use
    or runs two creations for one key at once."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.actor = FakeActor(self.clock, ttl=300.0)
        self.cache = make(self.clock, self.actor, margin=30.0)
        self.held: list[Handle] = []

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    @rule(n=st.integers(1, 8))
    def concurrent_gets(self, n: int) -> None:
        async def go() -> list[Handle | None]:
            async def one() -> Handle | None:
                try:
                    return await self.cache.get(KEY)
                except HandleUnavailable:
                    return None

            return list(await asyncio.gather(*(one() for _ in range(n))))

        for handle in self.run(go()):
            if handle is not None:
                assert handle.expires_at - 30.0 > self.clock.time(), "stale handle handed out"
                self.held.append(handle)

    @rule(n=st.integers(1, 8), pick_old=st.booleans())
    def concurrent_409s(self, n: int, pick_old: bool) -> None:
        if not self.held:
            return
        failed = self.held[0] if pick_old else self.held[-1]

        async def go() -> list[Handle | None]:
            async def one() -> Handle | None:
                try:
                    return await self.cache.replace(KEY, failed)
                except HandleUnavailable:
                    return None

            return list(await asyncio.gather(*(one() for _ in range(n))))

        results = self.run(go())
        for handle in results:
            if handle is not None:
                assert handle is not failed
                assert handle.expires_at - 30.0 > self.clock.time()
                self.held.append(handle)
        self.held = self.held[-20:]

    @rule(seconds=st.floats(0, 400))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(fail=st.booleans())
    def actor_health(self, fail: bool) -> None:
        self.actor.fail = fail

    @invariant()
    def one_creation_at_a_time(self) -> None:
        assert self.actor.max_in_flight <= 1

    @invariant()
    def cached_handle_is_the_newest(self) -> None:
        cached = self.cache.peek(KEY)
        if cached is not None:
            assert cached is self.actor.created[-1]

    def teardown(self) -> None:
        self.run(self.cache.close())
        self.loop.close()


TestHandleCacheMachine = HandleCacheMachine.TestCase
TestHandleCacheMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


async def test_forget_releases_the_handle_and_the_next_get_makes_a_new_one() -> None:
    clock = ManualClock()
    actor = FakeActor(clock)
    cache = make(clock, actor)
    first = await cache.get(KEY)
    cache.forget(KEY)
    cache.forget(KEY)  # twice: nothing more to release
    await asyncio.sleep(0)
    assert actor.released == [first.run_id]
    assert (await cache.get(KEY)).run_id != first.run_id
    await cache.close()

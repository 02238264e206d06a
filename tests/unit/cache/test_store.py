"""The in-process LRU: it evicts the least recently used, expires entries, refuses one over its
cap, and holds its bounds whatever happens."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.cache.store import LocalCacheStore
from ballast.resilience.clock import ManualClock


async def test_lru_evicts_least_recently_used_and_expires_entries() -> None:
    clock = ManualClock()
    store = LocalCacheStore(max_bytes=30, max_entries=3, clock=clock)
    for name in "abc":
        assert await store.put(name, name.encode() * 10, ttl=60, max_bytes=100)
    assert await store.get("a") == b"a" * 10  # a is now the most recent
    assert await store.put("d", b"d" * 10, ttl=60, max_bytes=100)
    assert await store.get("b") is None  # the least recently used went
    assert await store.get("a") is not None and await store.get("d") is not None
    clock.advance(61)
    assert await store.get("a") is None
    assert store.size == 20  # expired entries are dropped as they are met


async def test_an_entry_over_its_cap_is_refused_and_evicts_nothing() -> None:
    store = LocalCacheStore(max_bytes=100, max_entries=10)
    assert await store.put("small", b"x" * 10, ttl=60, max_bytes=50)
    assert not await store.put("huge", b"y" * 51, ttl=60, max_bytes=50)
    assert not await store.put("huger", b"y" * 101, ttl=60, max_bytes=1000)
    assert await store.get("small") == b"x" * 10
    assert await store.get("huge") is None and len(store) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 40), st.booleans()), max_size=60)
)
def test_lru_bounds_hold_whatever_happens(ops: list[tuple[str, int, bool]]) -> None:
    async def run() -> None:
        store = LocalCacheStore(max_bytes=100, max_entries=4)
        model: dict[str, bytes] = {}
        for name, size, write in ops:
            if write:
                value = name.encode() * size
                if await store.put(name, value, ttl=60, max_bytes=60):
                    model[name] = value
            else:
                got = await store.get(name)
                assert got is None or got == model.get(name)
            assert store.size <= 100 and len(store) <= 4
            assert store.size == sum(len(entry[1]) for entry in store._entries.values())

    asyncio.run(run())

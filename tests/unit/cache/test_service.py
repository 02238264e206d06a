"""The cache's lookup: its statuses, a coalesced hit, scopes and the refresh and off modes."""

from __future__ import annotations

import asyncio
from typing import Any

from ballast.cache.service import BYPASS, DEFAULT, HIT, MISS, OFF, REFRESH, ResponseCache
from ballast.cache.store import LocalCacheStore
from ballast.config import CacheSettings

CHAT = "/chat/completions"
BASE: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 20,
}


async def test_lookup_statuses_and_coalesced_hit() -> None:
    cache = ResponseCache(LocalCacheStore())
    on = CacheSettings(coalesce=True)
    payload = dict(BASE)
    first = await cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT)
    assert first.status == MISS and first.body is None
    waiter = asyncio.create_task(cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT))
    await asyncio.sleep(0.01)
    await first.store(b'{"x":1}')
    follower = await waiter
    assert follower.status == HIT and follower.body == b'{"x":1}'
    assert (await cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT)).status == HIT
    assert (await cache.lookup(CHAT, "chat", payload, "other", on, DEFAULT)).status == MISS
    shared = CacheSettings(scope="global")
    await (await cache.lookup(CHAT, "chat", payload, "a", shared, DEFAULT)).store(b"{}")
    assert (await cache.lookup(CHAT, "chat", payload, "b", shared, DEFAULT)).status == HIT
    refresh = await cache.lookup(CHAT, "chat", payload, "k", on, REFRESH)
    assert refresh.status == BYPASS and refresh.write
    off = await cache.lookup(CHAT, "chat", payload, "k", on, OFF)
    assert off.status == BYPASS and not off.write

"""Where cached answers live: Redis when configured (compressed, with a TTL, every call through
the one breaker), an in-process LRU otherwise. Both refuse an entry over its size cap, so one
huge answer cannot push out the rest. A lookup that cannot be answered is a miss."""

from __future__ import annotations

import logging
import zlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.store import RedisStore, StoreUnavailable

if TYPE_CHECKING:  # redis is imported only when a Redis URL is configured
    from redis.asyncio import Redis

log = logging.getLogger("ballast.cache")

DEFAULT_PREFIX = "ballast:cache:"


class CacheStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl: float, max_bytes: int) -> bool: ...


class LocalCacheStore:
    """A bounded LRU in this process: at most `max_entries` entries and `max_bytes` bytes."""

    def __init__(
        self,
        max_bytes: int = 64 * 1024 * 1024,
        max_entries: int = 10_000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.clock = clock
        self.size = 0
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if expires <= self.clock.monotonic():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    async def put(self, key: str, value: bytes, ttl: float, max_bytes: int) -> bool:
        if len(value) > max_bytes or len(value) > self.max_bytes:
            return False
        self._drop(key)
        self._entries[key] = (self.clock.monotonic() + ttl, value)
        self.size += len(value)
        while self.size > self.max_bytes or len(self._entries) > self.max_entries:
            oldest = next(iter(self._entries))
            self._drop(oldest)
        return True

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.size -= len(entry[1])


class RedisCacheStore:
    """Entries in Redis under `prefix` + digest, zlib-compressed, expiring after their TTL."""

    def __init__(self, store: RedisStore, prefix: str = DEFAULT_PREFIX) -> None:
        self.store = store
        self.prefix = prefix

    async def get(self, key: str) -> bytes | None:
        name = self.prefix + key

        async def fetch(r: Redis) -> bytes | None:
            value = await r.get(name)
            return value if isinstance(value, bytes) else None

        try:
            packed = await self.store.call(fetch)
        except StoreUnavailable:
            return None  # a slow or absent Redis is a miss, never an error
        if packed is None:
            return None
        try:
            return zlib.decompress(packed)
        except zlib.error:
            log.warning("dropping an unreadable cache entry")
            return None

    async def put(self, key: str, value: bytes, ttl: float, max_bytes: int) -> bool:
        if len(value) > max_bytes:
            return False
        packed = zlib.compress(value, 1)
        name = self.prefix + key
        ttl_ms = max(1, int(ttl * 1000))

        async def store(r: Redis) -> None:
            await r.set(name, packed, px=ttl_ms)

        try:
            await self.store.call(store)
        except StoreUnavailable:
            return False
        return True

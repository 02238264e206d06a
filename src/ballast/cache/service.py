"""The response cache as the request path uses it: look up (or wait for an identical request
already on its way upstream), then store a complete answer. Every failure inside is a miss."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ballast.cache.flight import SingleFlight
from ballast.cache.keys import cache_key
from ballast.cache.store import CacheStore, LocalCacheStore, RedisCacheStore
from ballast.config import CacheSettings, Settings
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.store import RedisStore

log = logging.getLogger("ballast.cache")

HIT = b"hit"
MISS = b"miss"
BYPASS = b"bypass"


@dataclass(frozen=True, slots=True)
class Mode:
    """What a request lets the cache do: answer it (`read`) and keep its answer (`write`)."""

    read: bool = True
    write: bool = True

    @property
    def status(self) -> bytes:
        return MISS if self.read else BYPASS


DEFAULT = Mode()
OFF = Mode(False, False)
REFRESH = Mode(False, True)
NO_STORE = Mode(True, False)


class Lookup:
    """One request's business with the cache: its answer (a hit), or the duty to store one."""

    __slots__ = ("_cache", "_leads", "body", "key", "settings", "status", "write")

    def __init__(
        self,
        cache: ResponseCache,
        key: str,
        settings: CacheSettings,
        status: bytes,
        write: bool,
        body: bytes | None = None,
        leads: bool = False,
    ) -> None:
        self._cache = cache
        self.key = key
        self.settings = settings
        self.status = status
        self.write = write
        self.body = body
        self._leads = leads

    async def store(self, body: bytes) -> None:
        """Keep a complete answer (the caller checked it is one) and hand it to any waiters."""
        if self.write:
            try:
                stored = await self._cache.store.put(
                    self.key, body, self.settings.ttl, self.settings.max_entry_bytes
                )
            except Exception:
                log.exception("could not store a cache entry")
                stored = False
            if stored:
                self._cache.stored += 1
        self.done(body)

    def done(self, body: bytes | None = None) -> None:
        """Release waiters (with this answer, or None to hand the turn on). Idempotent."""
        if self._leads:
            self._leads = False
            self._cache.flight.finish(self.key, body)


class ResponseCache:
    def __init__(self, store: CacheStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.flight = SingleFlight(clock)
        self.hits = 0
        self.misses = 0
        self.stored = 0

    async def lookup(
        self,
        path: str,
        group: str,
        payload: dict[str, Any],
        scope: str,
        settings: CacheSettings,
        mode: Mode,
    ) -> Lookup:
        key = cache_key(path, group, payload, scope if settings.scope == "key" else "")
        if not mode.read:
            return Lookup(self, key, settings, BYPASS, mode.write)
        try:
            body = await self.store.get(key)
        except Exception:
            log.exception("cache lookup failed; treating it as a miss")
            body = None
        if body is not None:
            self.hits += 1
            return Lookup(self, key, settings, HIT, False, body)
        leads = False
        if settings.coalesce:
            body, leads = await self.flight.wait(key, settings.coalesce_wait)
            if body is not None:
                self.hits += 1
                return Lookup(self, key, settings, HIT, False, body)
        self.misses += 1
        return Lookup(self, key, settings, MISS, mode.write, leads=leads)


def build_cache(settings: Settings, store: RedisStore | None, clock: Clock) -> ResponseCache:
    """The response cache: in Redis when the gateway has it (shared by every instance),
    else in this process's memory, bounded."""
    state = settings.state
    backend: CacheStore = (
        RedisCacheStore(store, state.cache_prefix)
        if store is not None
        else LocalCacheStore(state.cache_local_bytes, clock=clock)
    )
    return ResponseCache(backend, clock)

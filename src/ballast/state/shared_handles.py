"""Remote resource handles shared by every Ballast instance through Redis, with a
cross-instance single-flight lock that expires on its own (a crashed holder never blocks the
others for longer than the lock's life). Any Redis trouble raises StoreUnavailable and the
handle cache falls back to its local behaviour."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict

import orjson

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.handles import Handle, HandleUnavailable, Key
from ballast.state.store import RedisStore, StoreUnavailable

# Delete the shared handle only if it is still the one that failed (compare-and-delete).
_DELETE_IF_RUN = """
local raw = redis.call('GET', KEYS[1])
if raw and cjson.decode(raw)['run_id'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class SharedHandles:
    def __init__(
        self,
        store: RedisStore,
        namespace: str,
        clock: Clock = SYSTEM_CLOCK,
        lock_ttl: float = 10.0,
        poll_interval: float = 0.05,
    ) -> None:
        self.store = store
        self.namespace = namespace  # the deployment id: handles are per actor
        self.clock = clock
        self.lock_ttl = lock_ttl
        self.poll_interval = poll_interval
        self._delete_if_run = store.client.register_script(_DELETE_IF_RUN)
        self._unlock = store.client.register_script(_UNLOCK)
        self.adopted = 0

    def _keys(self, key: Key) -> tuple[str, str]:
        base = f"ballast:handle:{self.namespace}:{key[0]}:{key[1]}"
        return base, base + ":lock"

    async def _read(self, name: str) -> Handle | None:
        raw = await self.store.call(lambda r: r.get(name))
        return Handle(**orjson.loads(raw)) if raw else None

    async def _create_locked(
        self, name: str, lock: str, create: Callable[[], Awaitable[Handle]]
    ) -> Handle | None:
        """Make the handle if this instance wins the lock; None when another one holds it."""
        token = uuid.uuid4().hex
        ttl_ms = int(self.lock_ttl * 1000)
        if not await self.store.call(lambda r: r.set(lock, token, nx=True, px=ttl_ms)):
            return None
        try:
            handle = await create()
            life_ms = max(1000, int((handle.expires_at - self.clock.time()) * 1000))
            payload = orjson.dumps(asdict(handle))
            with contextlib.suppress(StoreUnavailable):  # others then make their own
                await self.store.call(lambda r: r.set(name, payload, px=life_ms))
            return handle
        finally:
            with contextlib.suppress(StoreUnavailable):  # the lock expires on its own
                await self.store.call(lambda r: self._unlock(keys=[lock], args=[token]))

    async def obtain(
        self,
        key: Key,
        stale: Handle | None,
        create: Callable[[], Awaitable[Handle]],
        usable: Callable[[Handle], bool],
    ) -> Handle:
        """A handle another instance already made, or one made here under the shared lock."""
        name, lock = self._keys(key)
        if stale is not None:
            await self.store.call(lambda r: self._delete_if_run(keys=[name], args=[stale.run_id]))
        deadline = self.clock.monotonic() + self.lock_ttl
        while True:
            shared = await self._read(name)
            if (
                shared is not None
                and usable(shared)
                and (stale is None or shared.run_id != stale.run_id)
            ):
                self.adopted += 1
                return shared
            made = await self._create_locked(name, lock, create)
            if made is not None:
                return made
            if self.clock.monotonic() >= deadline:
                raise HandleUnavailable("another instance holds the run lock", self.lock_ttl)
            await self.clock.sleep(self.poll_interval)

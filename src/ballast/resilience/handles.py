"""Remote resource handles that heal themselves (seed 000).

A handle names a remote resource: a sampling run on an actor, with its token. The cache keys
handles by (credential, model) and never assumes how long the remote keeps the resource: it
refreshes tokens ahead of their expiry, and when the remote says the resource is gone
(`sampling_run_inactive`) it replaces exactly the handle that failed (compare-and-delete, so
a fresh handle made by a concurrent request survives). Concurrent requests that need a new
handle share one creation (single-flight); a failed creation leaves nothing stale behind and
backs off before the next try."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ballast.resilience.backoff import Backoff
from ballast.resilience.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("ballast.handles")

Key = tuple[str, str]  # (credential id, model)


@dataclass(frozen=True, slots=True)
class Handle:
    session_id: str
    run_id: str
    endpoint: str  # base URL for requests on this run
    token: str
    expires_at: float  # wall-clock seconds


class HandleUnavailable(Exception):
    """No handle could be made; `retry_after` says when the next creation will be tried."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


CreateHandle = Callable[[Key, str | None], Awaitable[Handle]]


class SharedSource(Protocol):
    async def obtain(
        self,
        key: Key,
        stale: Handle | None,
        create: Callable[[], Awaitable[Handle]],
        usable: Callable[[Handle], bool],
    ) -> Handle: ...


ReleaseHandle = Callable[[Handle], Awaitable[None]]


@dataclass(slots=True)
class HandleStats:
    created: int = 0
    refreshed: int = 0
    healed: int = 0
    failed: int = 0


class HandleCache:
    def __init__(
        self,
        create: CreateHandle,
        release: ReleaseHandle | None = None,
        clock: Clock = SYSTEM_CLOCK,
        refresh_margin: float = 60.0,
        failure_backoff: float = 1.0,
        max_failure_backoff: float = 30.0,
    ) -> None:
        self._create = create
        self._release = release
        self._clock = clock
        self.refresh_margin = refresh_margin
        # Not jittered: the wait is told to the waiting clients as their Retry-After.
        self._backoff = Backoff(failure_backoff, max_failure_backoff, jitter=0.0)
        self._handles: dict[Key, Handle] = {}
        self._sessions: dict[Key, str] = {}
        # A flight ends in the handle, or in the backoff before the next try: never in an
        # error, which raised to each waiter would hold their frames, which hold the flight.
        self._flights: dict[Key, asyncio.Future[Handle | float]] = {}
        self._failures: dict[Key, tuple[int, float]] = {}  # (count, next allowed monotonic)
        self._background: set[asyncio.Task[None]] = set()
        self._lifetimes: dict[str, float] = {}  # run id -> token life when it was issued
        self.stats = HandleStats()
        self.shared: SharedSource | None = None  # handles shared across instances (Redis)

    def __len__(self) -> int:
        return len(self._handles)

    def peek(self, key: Key) -> Handle | None:
        return self._handles.get(key)

    def _fresh(self, handle: Handle) -> bool:
        """Usable without a refresh. The margin never exceeds half the token's life, so a
        short-lived token is not refreshed on every request."""
        now = self._clock.time()
        life = self._lifetimes.get(handle.run_id, self.refresh_margin * 2)
        return handle.expires_at - min(self.refresh_margin, life / 2) > now

    async def get(self, key: Key) -> Handle:
        """A usable handle for `key`, created or refreshed if needed."""
        handle = self._handles.get(key)
        if handle is not None and self._fresh(handle):
            return handle
        if handle is not None:
            self.stats.refreshed += 1
        return await self._single_flight(key, handle)

    async def replace(self, key: Key, failed: Handle) -> Handle:
        """The remote rejected `failed`: drop it if it is still the cached one, then get a
        new one. Concurrent callers holding the same failed handle share one creation."""
        current = self._handles.get(key)
        if current is failed:
            del self._handles[key]
            self._lifetimes.pop(failed.run_id, None)
            self.stats.healed += 1
            self._retire(failed)
        elif current is not None and self._fresh(current):
            return current  # someone already replaced it
        return await self._single_flight(key, failed)

    async def _single_flight(self, key: Key, stale: Handle | None) -> Handle:
        flight = self._flights.get(key)
        if flight is None:
            _, not_before = self._failures.get(key, (0, 0.0))
            wait = not_before - self._clock.monotonic()
            if wait > 0:
                raise HandleUnavailable("creating a run failed recently; backing off", wait)
            flight = asyncio.get_running_loop().create_future()
            self._flights[key] = flight
            task = asyncio.get_running_loop().create_task(self._make(key, stale, flight))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        made = await asyncio.shield(flight)
        if isinstance(made, Handle):
            return made
        raise HandleUnavailable("could not create a run", made)

    async def _make(
        self, key: Key, stale: Handle | None, flight: asyncio.Future[Handle | float]
    ) -> None:
        try:
            handle = await self._obtain(key, stale)
        except Exception as exc:
            if self._handles.get(key) is stale and stale is not None:
                del self._handles[key]  # never leave a handle we know to be bad
            count = self._failures.get(key, (0, 0.0))[0] + 1
            backoff = self._backoff.delay(count - 1)
            self._failures[key] = (count, self._clock.monotonic() + backoff)
            self.stats.failed += 1
            log.warning("could not create a handle for %s: %s", key[1], type(exc).__name__)
            flight.set_result(backoff)
        else:
            self._failures.pop(key, None)
            self._sessions[key] = handle.session_id
            previous = self._handles.get(key)
            if previous is not None:
                self._lifetimes.pop(previous.run_id, None)
            self._lifetimes[handle.run_id] = handle.expires_at - self._clock.time()
            self._handles[key] = handle
            self.stats.created += 1
            if previous is not None and previous is not handle:
                self._retire(previous)
            flight.set_result(handle)
        finally:
            self._flights.pop(key, None)

    async def _obtain(self, key: Key, stale: Handle | None) -> Handle:
        """Adopt a handle another instance made, or make one; locally when sharing fails."""

        async def create() -> Handle:
            return await self._create(key, self._sessions.get(key))

        if self.shared is not None:
            try:
                return await self.shared.obtain(key, stale, create, self._fresh)
            except HandleUnavailable:
                raise
            except Exception as exc:
                log.info(
                    "shared handles unavailable (%s); using the local cache", type(exc).__name__
                )
        return await create()

    def forget(self, key: Key) -> None:
        """Whoever held `key` is gone (a client ended its session): release its handle."""
        handle = self._handles.pop(key, None)
        self._sessions.pop(key, None)
        self._failures.pop(key, None)
        if handle is not None:
            self._lifetimes.pop(handle.run_id, None)
            self._retire(handle)

    def _retire(self, handle: Handle) -> None:
        """Release a replaced handle's remote resource, best effort, off the request path."""
        if self._release is None:
            return
        release = self._release

        async def run() -> None:
            try:
                await release(handle)
            except Exception:
                log.info("releasing run %s failed (it may already be gone)", handle.run_id)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

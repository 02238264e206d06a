"""Per-key rate limits: requests per minute, tokens per minute, parallel requests.

Shared across instances through Redis when it is healthy; a local limiter enforcing this
instance's share when it is not (seed 003: a slow Redis must not slow a request).

Windows. RPM and TPM use a *sliding window counter*: fixed 60 s windows aligned on the
clock, and the previous window's count weighted by how much of it still overlaps the last
60 s. Usage at time t, `into` seconds into the current window:

    used = previous * (60 - into) / 60 + current

A request is admitted when `used + cost <= limit`. This is O(1) per key (two counters per
limit, no per-request log), so reconciling tokens after a response is one addition to the
window the estimate went into. It equals an exact sliding window when traffic in the
previous window was evenly spread, and never lets a burst through at a window boundary.

Tokens. `acquire` books the caller's estimate; `release` adds `actual - estimated` to the
same window (or to the previous one, if the window has rolled since; older is dropped).
A request whose estimate alone exceeds the whole TPM limit is admitted only when the key's
window is empty (it cannot ever fit otherwise), and then books its full estimate.

Redis. A Lua script judges acquires (atomic, Redis server time, never the gateway's clock,
so instances with skewed clocks agree). The acquires asked in one turn of the event loop go
out together in one pipeline, one script call per key: under load one round trip serves
many requests, and a busy key's counters are read and written once for all of them. The
script judges each acquire after the ones before it, exactly as separate calls would, so
the limits are exactly as strict. The connection is the lean one of `resp.py`. Keys, all
with the key id as a cluster hash tag:

    ballast:rl:{<key_id>}     hash: w (window number), rc/rp (requests current/previous),
                              tc/tp (tokens current/previous); expires after two windows
    ballast:rl:{<key_id>}:p   sorted set of parallel leases scored by their expiry; expired
                              leases are dropped before counting, so a crashed instance's
                              slots come back after `lease_ttl` without anyone's help

Releases (drop the lease, reconcile tokens) cost no round trip of their own on the hot path:
`release_soon` defers them, and the key's next acquire script applies them before it counts
(so this instance never sees its own finished requests as in flight), or, when no acquire
comes, one pipelined flush sends every deferred release within `release_delay`. Other
instances see a freed slot or a token correction at most that much later. `release` (await)
sends one at once. A release that cannot reach Redis is remembered and its lease dropped by
the key's next acquire script (its token correction is dropped: the estimate stands).
Retry-After for a full parallel limit is 1 s (no one knows when a slot frees); for RPM/TPM
it is exact, assuming nothing else is admitted meanwhile.
`x-ratelimit-reset-*` is the time until all current usage has aged out of the window; on a
refusal the pipeline sets the refusing limit's reset to its Retry-After (`access.py`).

Fallback. Without Redis, or whenever the store raises `StoreUnavailable` (its breaker is
open: zero network calls), each instance enforces its share of every limit:
ceil(limit / instances), at least 1, with the same windows on the local monotonic clock.
Local counters start empty when a fallback starts (an instance may admit up to its share
on top of what Redis had counted). An open breaker is checked before anything else, so the
fallback costs about as much as the local limiter alone. Any limit of 0 refuses every
request.

The code is in four modules: the leases and headers (`ratelimit_lease.py`), the local
limiter (`ratelimit_local.py`), the Redis side (`ratelimit_redis.py`) and its scripts
(`ratelimit_lua.py`); `RateLimiter` here joins the two halves and is what callers use.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.state.ratelimit_lease import (
    _LOCAL,
    _NONE,
    _SHARED,
    WINDOW,
    Lease,
    Limits,
    RateLimited,
    _LocalKey,
    reset_header,
)
from ballast.state.ratelimit_local import LocalSide
from ballast.state.ratelimit_lua import ACQUIRE_LUA, RELEASE_LUA
from ballast.state.ratelimit_redis import RedisSide, _Ask
from ballast.state.ratelimit_shm import SharedWindows
from ballast.state.store import RedisStore, StoreUnavailable

__all__ = [
    "ACQUIRE_LUA",
    "RELEASE_LUA",
    "WINDOW",
    "Lease",
    "Limits",
    "RateLimited",
    "RateLimiter",
    "reset_header",
]


class RateLimiter(RedisSide, LocalSide):
    """Per-key RPM, TPM and parallel limits; see the module docstring for the design."""

    def __init__(
        self,
        store: RedisStore | None,
        instances: int = 1,
        clock: Clock = SYSTEM_CLOCK,
        *,
        lease_ttl: float = 900.0,
        prefix: str = "ballast:rl:",
        release_delay: float = 0.05,
        shared: SharedWindows | None = None,
    ) -> None:
        self._store = store
        self._shared = shared  # the machine's windows, for the local side
        self._instances = max(1, instances)
        self._least_instances = self._instances  # the configured number: a floor
        self._clock = clock
        self._lease_ttl_ms = max(1, int(lease_ttl * 1000))
        self._prefix = prefix
        self._local: dict[str, _LocalKey] = {}
        self._pruned = -1
        # Releases not yet in Redis, per key: (lease id, window booked, token delta).
        self._deferred: dict[str, list[tuple[str, int, int]]] = {}
        self._release_delay = release_delay
        self._flush_timer: Timer | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._asks: list[_Ask] = []  # acquires waiting for this turn's pipeline
        self._releasing: dict[str, asyncio.Future[None]] = {}  # keys with releases in flight
        self._ids = itertools.count()
        self._id_prefix = os.urandom(6).hex() + ":"
        self.fallbacks = 0  # acquires that took the local limiter because Redis could not

    @property
    def instances(self) -> int:
        return self._instances

    def set_instances(self, count: int) -> None:
        """How many instances share the limits now (the fleet counts them): the share each
        enforces alone while Redis is out of reach. Never fewer than configured: a count
        made while the others were still starting would be too few."""
        self._instances = max(self._least_instances, count)

    # -- acquire -----------------------------------------------------------------------

    async def acquire(self, limits: Limits, estimated_tokens: int) -> Lease:
        """Admit one request or raise RateLimited. Books `estimated_tokens` against TPM."""
        lease = self.acquire_now(limits, estimated_tokens)
        if lease is not None:
            return lease
        return await self.acquire_shared(limits, estimated_tokens)

    async def acquire_shared(self, limits: Limits, estimated_tokens: int) -> Lease:
        """`acquire` in Redis, after `acquire_now` found it must be asked; the local share
        when Redis cannot answer."""
        cost = estimated_tokens if estimated_tokens > 0 else 0
        try:
            return await self._acquire_redis(limits, cost)
        except StoreUnavailable:
            self.fallbacks += 1
            return self._acquire_local(limits, cost)

    def acquire_now(self, limits: Limits, estimated_tokens: int) -> Lease | None:
        """`acquire` when no round trip is needed (no limits, no Redis, or its breaker is
        open), without a coroutine; None when Redis must be asked."""
        rpm, tpm, par = limits.rpm, limits.tpm, limits.max_parallel
        if rpm is None and tpm is None and par is None:
            return Lease(_NONE, limits.key_id, 0, 0, "", [])
        store = self._store
        if store is not None:
            # An open breaker would refuse anyway; skipping the call keeps this ~1 us.
            if store.breaker.state is not BreakerState.OPEN:
                return None
            self.fallbacks += 1
        return self._acquire_local(limits, estimated_tokens if estimated_tokens > 0 else 0)

    async def close(self) -> None:
        """Shutdown: deferred releases sent, the machine's windows unmapped."""
        await super().close()
        if self._shared is not None:
            self._shared.close()

    # -- release -----------------------------------------------------------------------

    def release_soon(self, lease: Lease, actual_tokens: int | None) -> None:
        """Give the parallel slot back and reconcile TPM with the real usage, without a
        round trip of its own (see the module docstring). Never raises."""
        release = self._settle(lease, actual_tokens)
        if release is not None:
            self._defer(lease.key_id, release)

    async def release(self, lease: Lease, actual_tokens: int | None) -> None:
        """As `release_soon`, sent to Redis now. Never raises."""
        release = self._settle(lease, actual_tokens)
        if release is not None:
            await self._send({lease.key_id: [release]})

    def _settle(self, lease: Lease, actual_tokens: int | None) -> tuple[str, int, int] | None:
        """Release a local lease at once; what a Redis one needs sent, or None."""
        if lease.released or lease._kind == _NONE:
            return None
        lease.released = True
        delta = 0 if actual_tokens is None else max(0, actual_tokens) - lease.estimated
        if lease._kind == _LOCAL or lease._kind == _SHARED:
            self._release_local(lease, delta)
            return None
        if not lease._lease_id and not delta:
            return None
        return (lease._lease_id, lease._window, delta)

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
`x-ratelimit-reset-*` is the time until all current usage has aged out of the window.

Fallback. Without Redis, or whenever the store raises `StoreUnavailable` (its breaker is
open: zero network calls), each instance enforces its share of every limit:
ceil(limit / instances), at least 1, with the same windows on the local monotonic clock.
Local counters start empty when a fallback starts (an instance may admit up to its share
on top of what Redis had counted). An open breaker is checked before anything else, so the
fallback costs about as much as the local limiter alone. Any limit of 0 refuses every
request.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import math
import os
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.resp import Command, ReplyError, is_no_script
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.ratelimit")

WINDOW: Final = 60.0
_PARALLEL_RETRY: Final = 1.0  # nobody knows when a slot frees; ask the client for a second
_MAX_PENDING: Final = 1000  # remembered releases per key while Redis is unreachable
_MAX_LOCAL_KEYS: Final = 50_000  # idle local entries are pruned beyond this

_REASONS: Final = ("", "requests", "tokens", "parallel")

# KEYS: counters hash, parallel lease set.
# ARGV: rpm, tpm, max_parallel (-1 = not enforced), lease ttl (ms), n, then n acquires of
#       two values each (cost, lease id), then releases to apply first, three values each:
#       lease id ('' none), the window number its tokens were booked in, token delta.
# Returns n replies, one per acquire in order: reason (0 admitted, 1 requests, 2 tokens,
#         3 parallel), window number, ms into the window, rc, rp, tc, tp (after it), leases
#         in flight, retry after (ms). Each acquire is judged after the ones before it, as
#         if each had run a script of its own; the counters are read and written once.
# Applies the releases in ARGV from index `first` on (KEYS as above).
_APPLY_RELEASES: Final = """
local function apply_releases(first)
  for i = first, #ARGV, 3 do
    if ARGV[i] ~= '' then redis.call('ZREM', KEYS[2], ARGV[i]) end
    local d = tonumber(ARGV[i + 2])
    if d ~= 0 then
      local w = tonumber(redis.call('HGET', KEYS[1], 'w'))
      local booked = tonumber(ARGV[i + 1])
      local f = nil
      if w == booked then f = 'tc' elseif w == booked + 1 then f = 'tp' end
      if f then
        local v = (tonumber(redis.call('HGET', KEYS[1], f)) or 0) + d
        if v < 0 then v = 0 end
        redis.call('HSET', KEYS[1], f, v)
      end
    end
  end
end
"""

ACQUIRE_LUA: Final = (
    _APPLY_RELEASES
    + """
local n = tonumber(ARGV[5])
apply_releases(6 + 2 * n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local W = 60000
local rpm, tpm, par = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local win = math.floor(now / W)
local into = now - win * W
local weight = (W - into) / W
local rc, rp, tc, tp = 0, 0, 0, 0
local counted = rpm >= 0 or tpm >= 0
if counted then
  local h = redis.call('HMGET', KEYS[1], 'w', 'rc', 'rp', 'tc', 'tp')
  local w = tonumber(h[1])
  if w == win then
    rc, rp = tonumber(h[2]) or 0, tonumber(h[3]) or 0
    tc, tp = tonumber(h[4]) or 0, tonumber(h[5]) or 0
  elseif w == win - 1 then
    rp, tp = tonumber(h[2]) or 0, tonumber(h[4]) or 0
  end
end
local inflight = 0
if par >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[2])
end
-- ms until p * (W - e) / W + c + need <= limit, e the time into the window
local function wait(p, c, need, limit)
  if limit <= 0 then return W end
  local room = limit - c - need
  if room >= 0 then
    return math.max(1, math.ceil(W * (1 - room / p)) - into)
  end
  return (W - into) + math.max(0, math.ceil(W * (1 - (limit - need) / c)))
end
local out = {}
local booked, leased = false, false
for i = 0, n - 1 do
  local cost = tonumber(ARGV[6 + 2 * i])
  local reason, retry = 0, 0
  if par >= 0 and inflight >= par then
    reason, retry = 3, 1000
  elseif rpm >= 0 and (rpm <= 0 or rp * weight + rc + 1 > rpm) then
    reason, retry = 1, wait(rp, rc, 1, rpm)
  elseif tpm >= 0 then
    local need = math.min(cost, tpm)
    if tpm <= 0 or tp * weight + tc + need > tpm then
      reason, retry = 2, wait(tp, tc, need, tpm)
    end
  end
  if reason == 0 then
    if counted then
      rc, tc = rc + 1, tc + cost
      booked = true
    end
    if par >= 0 then
      redis.call('ZADD', KEYS[2], now + ttl, ARGV[7 + 2 * i])
      inflight = inflight + 1
      leased = true
    end
  end
  out[i + 1] = {reason, win, into, rc, rp, tc, tp, inflight, retry}
end
if booked then
  redis.call('HSET', KEYS[1], 'w', win, 'rc', rc, 'rp', rp, 'tc', tc, 'tp', tp)
  redis.call('PEXPIRE', KEYS[1], 2 * W + 1000)
end
if leased then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return out
"""
)

# KEYS: counters hash, parallel lease set. ARGV: releases, three values each (as above).
RELEASE_LUA: Final = (
    _APPLY_RELEASES
    + """
apply_releases(1)
return 0
"""
)

_ACQUIRE_SHA: Final = hashlib.sha1(ACQUIRE_LUA.encode()).hexdigest()
_RELEASE_SHA: Final = hashlib.sha1(RELEASE_LUA.encode()).hexdigest()


class Limits(NamedTuple):
    """A key's limits; None is not enforced, 0 refuses everything. A tuple: one is made
    for every limited request, at half the cost of a frozen dataclass."""

    key_id: str
    rpm: int | None
    tpm: int | None
    max_parallel: int | None


class RateLimited(Exception):
    """Over a limit. `headers` are the x-ratelimit-* headers; the caller adds Retry-After."""

    def __init__(self, reason: str, retry_after: float, headers: list[tuple[bytes, bytes]]):
        super().__init__(f"rate limited ({reason}); retry after {retry_after:.3f}s")
        self.reason = reason
        self.retry_after = retry_after
        self.headers = headers


_NONE: Final = 0
_LOCAL: Final = 1
_REDIS: Final = 2


class Lease:
    """An admitted request. Hand it back with `RateLimiter.release` exactly once (a second
    release is ignored). `headers` are OpenAI's x-ratelimit-* headers for the response,
    built when it is admitted: every admitted request sends them."""

    __slots__ = (
        "_kind",
        "_lease_id",
        "_local",
        "_window",
        "estimated",
        "headers",
        "key_id",
        "released",
    )

    def __init__(
        self,
        kind: int,
        key_id: str,
        estimated: int,
        window: int,
        lease_id: str,
        headers: list[tuple[bytes, bytes]],
        local: _LocalKey | None = None,
    ) -> None:
        self._kind = kind
        self.key_id = key_id
        self.estimated = estimated
        self._window = window
        self._lease_id = lease_id
        self.headers = headers
        self._local = local
        self.released = False

    @property
    def shared(self) -> bool:
        """True when Redis admitted it (the limit is shared by all instances)."""
        return self._kind == _REDIS


class _LocalKey:
    """One key's local windows (seconds on the monotonic clock) and parallel count."""

    __slots__ = ("inflight", "rc", "rp", "tc", "tp", "window")

    def __init__(self) -> None:
        self.window = -2
        self.rc = self.rp = self.tc = self.tp = 0
        self.inflight = 0


class _Ask:
    """One acquire waiting for its turn's pipeline."""

    __slots__ = ("abandoned", "cost", "future", "group", "key_id", "lease_id", "pending")

    def __init__(
        self,
        group: tuple[str, int, int, int],
        cost: int,
        lease_id: str,
        pending: list[tuple[str, int, int]] | None,
    ) -> None:
        self.group = group  # key id and limits (-1: not enforced): one script call each
        self.key_id = group[0]
        self.cost = cost
        self.lease_id = lease_id
        self.pending = pending
        self.future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.abandoned = False


class RateLimiter:
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
    ) -> None:
        self._store = store
        self._instances = max(1, instances)
        self._clock = clock
        self._lease_ttl_ms = max(1, int(lease_ttl * 1000))
        self._prefix = prefix
        self._local: dict[str, _LocalKey] = {}
        self._pruned = -1
        # Releases not yet in Redis, per key: (lease id, window booked, token delta).
        self._deferred: dict[str, list[tuple[str, int, int]]] = {}
        self._release_delay = release_delay
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._asks: list[_Ask] = []  # acquires waiting for this turn's pipeline
        self._releasing: dict[str, asyncio.Future[None]] = {}  # keys with releases in flight
        self._ids = itertools.count()
        self._id_prefix = os.urandom(6).hex() + ":"
        self.fallbacks = 0  # acquires that took the local limiter because Redis could not

    async def warm(self) -> bool:
        """Load the scripts into Redis ahead of the first request (start-up), so a cold
        burst does not meet NOSCRIPT on every connection. False if Redis cannot be used
        now, which is not fatal: the scripts load on first use."""
        store = self._store
        if store is None:
            return False
        try:
            loaded = await store.execute(
                [("SCRIPT", "LOAD", ACQUIRE_LUA), ("SCRIPT", "LOAD", RELEASE_LUA)]
            )
        except StoreUnavailable:
            return False
        return not any(isinstance(reply, ReplyError) for reply in loaded)

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

    def _share(self, limit: int | None) -> int | None:
        if limit is None or limit <= 0 or self._instances == 1:
            return limit
        return max(1, -(-limit // self._instances))

    def _acquire_local(self, limits: Limits, cost: int) -> Lease:
        if self._instances == 1:
            rpm, tpm, par = limits.rpm, limits.tpm, limits.max_parallel
        else:
            rpm, tpm = self._share(limits.rpm), self._share(limits.tpm)
            par = self._share(limits.max_parallel)
        now = self._clock.monotonic()
        window = int(now // WINDOW)
        into = now - window * WINDOW
        state = self._local.get(limits.key_id)
        if state is None:
            if len(self._local) >= _MAX_LOCAL_KEYS and self._pruned != window:
                self._pruned = window  # at most one sweep per window
                self._prune_local(window)
            state = self._local[limits.key_id] = _LocalKey()
        if state.window != window:
            if state.window == window - 1:
                state.rp, state.tp = state.rc, state.tc
            else:
                state.rp = state.tp = 0
            state.rc = state.tc = 0
            state.window = window
        weight = (WINDOW - into) / WINDOW
        reason = 0
        retry = 0.0
        if par is not None and state.inflight >= par:
            reason, retry = 3, _PARALLEL_RETRY
        elif rpm is not None and (rpm <= 0 or state.rp * weight + state.rc + 1 > rpm):
            reason, retry = 1, _wait(state.rp, state.rc, 1, rpm, into)
        elif tpm is not None:
            need = min(cost, tpm)
            if tpm <= 0 or state.tp * weight + state.tc + need > tpm:
                reason, retry = 2, _wait(state.tp, state.tc, need, tpm, into)
        if reason:
            headers = _headers(rpm, tpm, into, state.rc, state.rp, state.tc, state.tp)
            raise RateLimited(_REASONS[reason], retry, headers)
        state.rc += 1
        state.tc += cost
        slot = ""
        if par is not None:
            state.inflight += 1
            slot = "local"
        headers = _headers(rpm, tpm, into, state.rc, state.rp, state.tc, state.tp)
        return Lease(_LOCAL, limits.key_id, cost, window, slot, headers, state)

    def _prune_local(self, window: int) -> None:
        stale = [k for k, s in self._local.items() if s.window < window - 1 and s.inflight <= 0]
        for k in stale:
            del self._local[k]

    async def _acquire_redis(self, limits: Limits, cost: int) -> Lease:
        rpm, tpm, par = limits.rpm, limits.tpm, limits.max_parallel
        key_id = limits.key_id
        lease_id = f"{self._id_prefix}{next(self._ids)}" if par is not None else ""
        sending = self._releasing.get(key_id)
        if sending is not None:  # this key's releases are on their way: count after them
            await asyncio.shield(sending)
        # Deferred releases ride along; they go back if this call fails.
        pending = self._deferred.pop(key_id, None)
        group = (
            key_id,
            -1 if rpm is None else rpm,
            -1 if tpm is None else tpm,
            -1 if par is None else par,
        )
        ask = _Ask(group, cost, lease_id, pending)
        self._asks.append(ask)
        if len(self._asks) == 1:  # the first of this turn of the loop sends them all
            asyncio.get_running_loop().call_soon(self._send_asks)
        try:
            reply = await ask.future
        except asyncio.CancelledError:
            ask.abandoned = True  # its slot, if Redis grants one, is given back
            raise
        except BaseException:  # unavailable: dropping them again is harmless
            if pending:
                self._keep(key_id, pending)
            raise
        reason, window, into_ms, rc, rp, tc, tp, _inflight, retry_ms = reply
        headers = _headers(rpm, tpm, into_ms / 1000.0, rc, rp, tc, tp)
        if reason:
            raise RateLimited(_REASONS[reason], retry_ms / 1000.0, headers)
        return Lease(_REDIS, key_id, cost, window, lease_id, headers)

    def _send_asks(self) -> None:
        asks, self._asks = self._asks, []
        task = asyncio.get_running_loop().create_task(self._run_asks(asks))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _run_asks(self, asks: list[_Ask]) -> None:
        """Every acquire asked in one turn of the event loop, in one pipelined round trip,
        and one script call per key (under load, one exchange serves many requests, and
        Redis reads and writes a busy key's counters once for all of them)."""
        groups: dict[tuple[str, int, int, int], list[_Ask]] = {}
        for ask in asks:
            groups.setdefault(ask.group, []).append(ask)
        calls: list[Command] = []
        for (key_id, rpm, tpm, par), members in groups.items():
            base = f"{self._prefix}{{{key_id}}}"
            call: list[str | int] = ["EVALSHA", _ACQUIRE_SHA, 2, base, base + ":p"]
            call += (rpm, tpm, par, self._lease_ttl_ms, len(members))
            for ask in members:
                call += (ask.cost, ask.lease_id)
            for ask in members:
                if ask.pending:
                    for release in ask.pending:
                        call.extend(release)
            calls.append(call)
        try:
            replies = await self._run_scripts(ACQUIRE_LUA, calls)
        except BaseException as exc:
            failure = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(repr(exc))
            for ask in asks:
                if not ask.future.done():
                    ask.future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        for members, reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, ReplyError):
                for ask in members:
                    if not ask.future.done():
                        ask.future.set_exception(StoreUnavailable(str(reply)))
                continue
            for ask, answer in zip(members, reply, strict=True):
                if ask.future.done():  # its request went away: give back what Redis granted
                    if ask.abandoned and answer[0] == 0 and (ask.lease_id or ask.cost):
                        self._defer(ask.key_id, (ask.lease_id, answer[1], -ask.cost))
                    continue
                ask.future.set_result(answer)

    # -- release -----------------------------------------------------------------------

    def release_soon(self, lease: Lease, actual_tokens: int | None) -> None:
        """Give the parallel slot back and reconcile TPM with the real usage, without a
        round trip of its own (see the module docstring). Never raises."""
        release = self._settle(lease, actual_tokens)
        if release is not None:
            self._defer(lease.key_id, release)

    def _defer(self, key_id: str, release: tuple[str, int, int]) -> None:
        self._deferred.setdefault(key_id, []).append(release)
        if self._flush_timer is None:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(self._release_delay, self._start_flush)

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
        if lease._kind == _LOCAL:
            self._release_local(lease, delta)
            return None
        if not lease._lease_id and not delta:
            return None
        return (lease._lease_id, lease._window, delta)

    def _release_local(self, lease: Lease, delta: int) -> None:
        state = lease._local
        if state is None:
            return
        if lease._lease_id and state.inflight > 0:  # it holds a parallel slot
            state.inflight -= 1
        if delta:
            if state.window == lease._window:
                state.tc = max(0, state.tc + delta)
            elif state.window == lease._window + 1:
                state.tp = max(0, state.tp + delta)

    def _start_flush(self) -> None:
        self._flush_timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Send every deferred release now (one pipelined round trip)."""
        deferred, self._deferred = self._deferred, {}
        if deferred:
            await self._send(deferred)

    async def close(self) -> None:
        """Shutdown: nothing deferred is left behind."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self.flush()

    async def _send(self, releases: dict[str, list[tuple[str, int, int]]]) -> None:
        """One pipeline of release scripts. Until it is answered, an acquire for one of its
        keys waits for it, so this instance never counts its own finished requests."""
        sent = asyncio.get_running_loop().create_future()
        for key_id in releases:
            self._releasing[key_id] = sent
        calls: list[Command] = []
        for key_id, items in releases.items():
            base = f"{self._prefix}{{{key_id}}}"
            calls.append(
                ("EVALSHA", _RELEASE_SHA, 2, base, base + ":p", *(v for i in items for v in i))
            )
        try:
            replies = await self._run_scripts(RELEASE_LUA, calls)
            failed = next((reply for reply in replies if isinstance(reply, ReplyError)), None)
            if failed is not None:
                raise StoreUnavailable(str(failed))
        except StoreUnavailable:
            for key_id, items in releases.items():
                self._keep(key_id, items)
        except Exception:  # never fail a finished request over its bookkeeping
            log.exception("rate limit release failed")
        finally:
            for key_id in releases:
                if self._releasing.get(key_id) is sent:
                    del self._releasing[key_id]
            sent.set_result(None)

    async def _run_scripts(self, source: str, calls: Sequence[Command]) -> list[Any]:
        """EVALSHA calls in one round trip; the ones Redis answers NOSCRIPT (it restarted or
        flushed its scripts; they did not run) go again after loading the script."""
        store = self._store
        assert store is not None
        replies = await store.execute(calls)
        missing = [i for i, reply in enumerate(replies) if is_no_script(reply)]
        if missing:
            again = await store.execute([("SCRIPT", "LOAD", source), *(calls[i] for i in missing)])
            for i, reply in zip(missing, again[1:], strict=True):
                replies[i] = reply
        return replies

    def _keep(self, key_id: str, releases: list[tuple[str, int, int]]) -> None:
        """Releases Redis did not take: their slots go with the key's next acquire (the
        token corrections are dropped: the estimates stand)."""
        kept = self._deferred.setdefault(key_id, [])
        for lease_id, _, _ in releases:
            if lease_id and len(kept) < _MAX_PENDING:
                kept.append((lease_id, 0, 0))


def _wait(p: int, c: int, need: int, limit: int, into: float) -> float:
    """Seconds until `p * (W - e) / W + c + need <= limit`, e the time into the window,
    assuming nothing else is admitted meanwhile."""
    if limit <= 0:
        return WINDOW
    room = limit - c - need
    if room >= 0:
        return max(0.001, WINDOW * (1 - room / p) - into)
    return (WINDOW - into) + max(0.0, WINDOW * (1 - (limit - need) / c))


def _headers(
    rpm: int | None, tpm: int | None, into: float, rc: int, rp: int, tc: int, tp: int
) -> list[tuple[bytes, bytes]]:
    """OpenAI's x-ratelimit-* headers. `reset` is the time until the window is back to
    its initial state (all usage aged out), as OpenAI defines it. Built for every limited
    response, so the two resets are formatted once when they agree (they usually do)."""
    out: list[tuple[bytes, bytes]] = []
    weight = (WINDOW - into) / WINDOW
    seconds = -1.0
    reset = b""
    if rpm is not None:
        seconds = _reset_seconds(rc, rp, into)
        reset = reset_header(seconds)
        out.append((b"x-ratelimit-limit-requests", b"%d" % rpm))
        out.append((b"x-ratelimit-remaining-requests", _remaining(rpm, rp * weight + rc)))
        out.append((b"x-ratelimit-reset-requests", reset))
    if tpm is not None:
        token_seconds = _reset_seconds(tc, tp, into)
        if token_seconds != seconds:
            reset = reset_header(token_seconds)
        out.append((b"x-ratelimit-limit-tokens", b"%d" % tpm))
        out.append((b"x-ratelimit-remaining-tokens", _remaining(tpm, tp * weight + tc)))
        out.append((b"x-ratelimit-reset-tokens", reset))
    return out


def _remaining(limit: int, used: float) -> bytes:
    return b"%d" % max(0, math.floor(limit - used + 1e-9))


def _reset_seconds(current: int, previous: int, into: float) -> float:
    if current > 0:
        return 2 * WINDOW - into
    if previous > 0:
        return WINDOW - into
    return 0.0


def reset_header(seconds: float) -> bytes:
    """A reset header's value: OpenAI's (Go-style) durations, "0s", "250ms", "1.5s",
    "1m30s", "2m0s", rounded up to the millisecond."""
    return _duration(math.ceil(seconds * 1000 - 1e-6))


@functools.lru_cache(maxsize=1024)
def _duration(ms: int) -> bytes:
    """Cached: at thousands of requests a second, several in a row share their millisecond
    (and a window's resets repeat), so most are a lookup rather than a float formatted and
    trimmed."""
    if ms <= 0:
        return b"0s"
    if ms < 1000:
        return b"%dms" % ms
    if ms < 60_000:
        return f"{ms / 1000:.3f}".rstrip("0").rstrip(".").encode() + b"s"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s".encode()

"""The local limiter: this instance's share of every limit, on the monotonic clock, used
when there is no Redis or it cannot be used now (its breaker is open, or a call failed).

Why a module of its own: it is the fallback that keeps admission working (and cheap, about
a microsecond) whatever Redis does, and it shares nothing with the Redis side but the
leases and headers. `RateLimiter` mixes it in; its attributes are set there.
"""

from __future__ import annotations

from typing import Final

from ballast.resilience.clock import Clock
from ballast.state.ratelimit_lease import (
    _LOCAL,
    _REASONS,
    _SHARED,
    WINDOW,
    Lease,
    Limits,
    RateLimited,
    _headers,
    _LocalKey,
)
from ballast.state.ratelimit_shm import SharedWindows

_PARALLEL_RETRY: Final = 1.0  # nobody knows when a slot frees; ask the client for a second
_MAX_LOCAL_KEYS: Final = 50_000  # idle local entries are pruned beyond this


class LocalSide:
    """`RateLimiter`'s local windows: the share of each limit this instance enforces."""

    _instances: int
    _clock: Clock
    _local: dict[str, _LocalKey]
    _pruned: int
    _shared: SharedWindows | None

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
        if self._shared is not None:
            key_id = limits.key_id
            lease = self._shared.update(
                key_id, lambda state: _judge(state, key_id, rpm, tpm, par, cost, now, _SHARED)
            )
            if lease is not None:
                return lease
        state = self._local.get(limits.key_id)
        if state is None:
            if len(self._local) >= _MAX_LOCAL_KEYS and self._pruned != window:
                self._pruned = window  # at most one sweep per window
                self._prune_local(window)
            state = self._local[limits.key_id] = _LocalKey()
        return _judge(state, limits.key_id, rpm, tpm, par, cost, now, _LOCAL)

    def _prune_local(self, window: int) -> None:
        stale = [k for k, s in self._local.items() if s.window < window - 1 and s.inflight <= 0]
        for k in stale:
            del self._local[k]

    def _release_local(self, lease: Lease, delta: int) -> None:
        if lease._kind == _SHARED:
            if self._shared is not None:
                self._shared.update(lease.key_id, lambda state: _release(state, lease, delta))
            return
        state = lease._local
        if state is not None:
            _release(state, lease, delta)


def _release(state: _LocalKey, lease: Lease, delta: int) -> None:
    if lease._lease_id and state.inflight > 0:  # it holds a parallel slot
        state.inflight -= 1
    if delta:
        if state.window == lease._window:
            state.tc = max(0, state.tc + delta)
        elif state.window == lease._window + 1:
            state.tp = max(0, state.tp + delta)


def _judge(
    state: _LocalKey,
    key_id: str,
    rpm: int | None,
    tpm: int | None,
    par: int | None,
    cost: int,
    now: float,
    kind: int,
) -> Lease:
    """Admit one request on a key's windows (rolled to now) or raise RateLimited."""
    window = int(now // WINDOW)
    into = now - window * WINDOW
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
    return Lease(kind, key_id, cost, window, slot, headers, state if kind == _LOCAL else None)


def _wait(p: int, c: int, need: int, limit: int, into: float) -> float:
    """Seconds until `p * (W - e) / W + c + need <= limit`, e the time into the window,
    assuming nothing else is admitted meanwhile."""
    if limit <= 0:
        return WINDOW
    room = limit - c - need
    if room >= 0:
        return max(0.001, WINDOW * (1 - room / p) - into)
    return (WINDOW - into) + max(0.0, WINDOW * (1 - (limit - need) / c))

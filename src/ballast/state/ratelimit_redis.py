"""The Redis side of the rate limiter: the acquires of one turn of the event loop sent as
one pipeline of script calls, releases deferred until they can ride along or be flushed
together, and releases Redis could not take remembered for the key's next acquire.

Why a module of its own: it is the part that does I/O, batches and retries (NOSCRIPT), and
it is skipped whole while Redis is unusable. `RateLimiter` mixes it in; its attributes are
set there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any, Final

from ballast.resilience.clock import Clock, Timer
from ballast.state.ratelimit_lease import _REASONS, _REDIS, Lease, Limits, RateLimited, _headers
from ballast.state.ratelimit_lua import _ACQUIRE_SHA, _RELEASE_SHA, ACQUIRE_LUA, RELEASE_LUA
from ballast.state.resp import Command, ReplyError, is_no_script
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.ratelimit")

_MAX_PENDING: Final = 1000  # remembered releases per key while Redis is unreachable


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


class RedisSide:
    """`RateLimiter`'s shared windows in Redis, and the releases on their way there."""

    _store: RedisStore | None
    _clock: Clock
    _lease_ttl_ms: int
    _prefix: str
    _deferred: dict[str, list[tuple[str, int, int]]]
    _release_delay: float
    _flush_timer: Timer | None
    _flushes: set[asyncio.Task[None]]
    _asks: list[_Ask]
    _releasing: dict[str, asyncio.Future[None]]
    _ids: itertools.count[int]
    _id_prefix: str

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

    def _defer(self, key_id: str, release: tuple[str, int, int]) -> None:
        self._deferred.setdefault(key_id, []).append(release)
        if self._flush_timer is None:
            self._flush_timer = self._clock.call_later(self._release_delay, self._start_flush)

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

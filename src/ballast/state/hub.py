"""Everything stateful, built from settings and started once: the database, Redis behind its
breaker, keys, rate limits and spend. Redis down at start-up is not fatal: its breaker
opens and every use takes its local fallback until a probe finds it healthy."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ballast.config import Settings, StateSettings
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.audit import AuditLog
from ballast.state.budget_ledger import Ledger, RedisLedger, SqlLedger
from ballast.state.budgets import Budgets
from ballast.state.db import Database
from ballast.state.keys import KeyService
from ballast.state.ratelimit import RateLimiter
from ballast.state.ratelimit_shm import SharedWindows
from ballast.state.spend import SpendRecorder
from ballast.state.spend_report import SpendReport
from ballast.state.store import RedisStore
from ballast.state.teams import TeamService

log = logging.getLogger("ballast.state")


class StateHub:
    def __init__(self, settings: Settings, clock: Clock = SYSTEM_CLOCK) -> None:
        state = settings.state
        self.clock = clock
        self.db = Database(state.database_url, timeout=state.database_timeout)
        self.store = RedisStore(state.redis_url, state, clock) if state.redis_url else None
        self.keys = KeyService(self.db, self.store, clock, cache_ttl=state.key_cache_ttl)
        self.teams = TeamService(self.db, clock)
        self.audit = AuditLog(self.db)
        self.spend_report = SpendReport(self.db)
        self.limiter = RateLimiter(
            self.store,
            instances=state.instances,
            clock=clock,
            release_delay=state.ratelimit_release_delay,
            shared=_shared_windows(state.spend_journal, clock) if _several_workers(state) else None,
        )
        self.spend = SpendRecorder(
            self.db, self.store, state.spend_journal, state.spend_flush_interval, clock
        )
        divisor = settings.budgets.grant_divisor
        ledger: Ledger = (
            RedisLedger(self.store, clock, divisor, self.spend.key_spend)
            if self.store is not None
            else SqlLedger(self.db, clock, divisor, self.spend.unflushed)
        )
        self.budgets = Budgets(
            ledger,
            clock,
            accept_for=settings.budgets.grant_accept_for,
            # A grant's requests end within the request timeout; past it, it lapses.
            expire_after=settings.budgets.grant_accept_for
            + settings.timeouts.request
            + settings.budgets.grant_lapse_margin,
        )

    async def start(self) -> None:
        await self.db.upgrade()
        await self.spend.start()
        if self.store is not None and not await self.limiter.warm():
            log.warning("Redis is unreachable at start-up; serving with local fallbacks")

    async def close(self) -> None:
        await self.budgets.close()
        await self.limiter.close()
        await self.spend.close()
        if self.store is not None:
            await self.store.close()
        await self.db.close()

    def status(self) -> dict[str, Any]:
        redis = self.store.status() if self.store is not None else {"configured": False}
        return {
            "redis": redis,
            "database": {"configured": True, "url_kind": self.db.url.split(":")[0]},
        }


def _shared_windows(journal: str, clock: Clock) -> SharedWindows | None:
    """The machine's rate-limit windows, beside the spend journal (one per deployment
    directory); None where a file cannot be mapped (limits are then per process)."""
    try:
        return SharedWindows(Path(journal + ".limits"), clock=clock)
    except OSError as exc:
        log.warning("rate limits are per worker: cannot map their shared file (%s)", exc)
        return None


def _several_workers(state: StateSettings) -> bool:
    """Whether this process is one of several `ballast serve` workers (set by the command
    before it starts them): one alone needs no shared windows, and skips their cost."""
    if not state.shared_limits:
        return False
    workers = os.environ.get("BALLAST_WORKERS", "1")
    return workers.isdigit() and int(workers) > 1

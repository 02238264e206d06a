"""The shared side of budgets: per key and period, what was spent and what is reserved, in
Redis when there, in the database otherwise, so every worker and instance draws on one
budget. A grant is a reservation with an expiry: an instance that dies leaves reservations
that lapse on their own, and the next grant on that key drops them.

Why a module of its own: the local side (`budgets.py`) runs on the hot path without I/O;
this one is the only place that talks to Redis or SQL about budgets.

A grant reserves at least what the request asks for and, when the budget has room to
spare, a share of what is left (`remaining / divisor`), so an instance under load asks
again only once per many requests, while near the end of a budget every grant is exactly
one request's worst case. What a grant's holder really spent is added at settle time."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import sqlalchemy as sa

from ballast.resilience.clock import Clock
from ballast.state.db import Database
from ballast.state.schema import budget_ledger, budget_reservations, spend_totals
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.budgets")


class LedgerUnavailable(Exception):
    """The shared ledger cannot be asked right now."""


class Ledger(Protocol):
    async def grant(
        self, key_id: str, period: str, budget: float, amount: float, grant_id: str, ttl: float
    ) -> float | None:
        """Reserve at least `amount` under `grant_id` for `ttl` seconds: what was reserved,
        or None when even `amount` does not fit."""
        ...

    async def settle(self, key_id: str, period: str, grant_id: str, spent: float) -> None:
        """Drop the reservation `grant_id` and count what its holder really spent."""
        ...


class SqlLedger:
    """Without Redis: two small tables. A grant is one write transaction (SQLite takes its
    write lock first; PostgreSQL locks the key's ledger row), so grants never race."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        divisor: float,
        unflushed: Callable[[str, str], float] | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.divisor = divisor
        # Spend recorded here but not yet in `spend_totals`: a ledger row born now counts it.
        self.unflushed = unflushed

    async def grant(
        self, key_id: str, period: str, budget: float, amount: float, grant_id: str, ttl: float
    ) -> float | None:
        now = self.clock.time()
        reservations = budget_reservations.c
        mine = (reservations.key_id == key_id) & (reservations.period == period)
        try:
            async with self.db.begin() as connection:
                # The first write takes SQLite's lock for the whole transaction.
                await connection.execute(
                    budget_reservations.delete().where(mine & (reservations.expires_at <= now))
                )
                used = await self._used(connection, key_id, period)
                reserved = (
                    await connection.execute(
                        sa.select(sa.func.coalesce(sa.func.sum(reservations.amount), 0.0)).where(
                            mine
                        )
                    )
                ).scalar_one()
                remaining = budget - used - float(reserved)
                if amount > remaining:
                    return None
                granted = min(max(amount, remaining / self.divisor), remaining)
                await connection.execute(
                    budget_reservations.insert().values(
                        id=grant_id,
                        key_id=key_id,
                        period=period,
                        amount=granted,
                        expires_at=now + ttl,
                    )
                )
                return granted
        except Exception as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc

    async def _used(self, connection: Any, key_id: str, period: str) -> float:
        """The key's ledger row, born from the spend recorded so far; locked on PostgreSQL."""
        ledger = budget_ledger.c
        extra = self.unflushed(key_id, period) if self.unflushed is not None else 0.0
        seed = sa.select(sa.func.coalesce(sa.func.max(spend_totals.c.cost), 0.0)).where(
            (spend_totals.c.key_id == key_id) & (spend_totals.c.period == period)
        )
        if self.db.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
        await connection.execute(
            insert(budget_ledger)
            .from_select(
                ["key_id", "period", "used"],
                sa.select(
                    sa.literal(key_id),
                    sa.literal(period),
                    seed.scalar_subquery() + sa.literal(extra, sa.Float),
                ),
            )
            .on_conflict_do_nothing()
        )
        query = sa.select(ledger.used).where((ledger.key_id == key_id) & (ledger.period == period))
        if not self.db.is_sqlite:
            query = query.with_for_update()
        return float((await connection.execute(query)).scalar_one())

    async def settle(self, key_id: str, period: str, grant_id: str, spent: float) -> None:
        ledger = budget_ledger.c
        try:
            async with self.db.begin() as connection:
                await connection.execute(
                    budget_reservations.delete().where(budget_reservations.c.id == grant_id)
                )
                if spent:
                    await connection.execute(
                        budget_ledger.update()
                        .where((ledger.key_id == key_id) & (ledger.period == period))
                        .values(used=ledger.used + spent)
                    )
        except Exception as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc


# KEYS: spent, expiries (zset), amounts (hash). ARGV: now, ttl, id, amount, budget, divisor,
# keep (ms). A missing `spent` is returned as false: the caller seeds it and asks again.
# Amounts go back as strings: Redis turns a Lua number reply into an integer.
_GRANT = """
local used = redis.call('GET', KEYS[1])
if not used then return false end
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(expired) do redis.call('HDEL', KEYS[3], id) end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local reserved = 0
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do reserved = reserved + tonumber(v) end
local remaining = tonumber(ARGV[5]) - tonumber(used) - reserved
local amount = tonumber(ARGV[4])
if amount > remaining then return '-1' end
local granted = math.min(math.max(amount, remaining / tonumber(ARGV[6])), remaining)
redis.call('HSET', KEYS[3], ARGV[3], tostring(granted))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3])
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[7]) end
return tostring(granted)
"""

# KEYS as above. ARGV: id, spent.
_SETTLE = """
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 and tonumber(ARGV[2]) ~= 0 then
  redis.call('INCRBYFLOAT', KEYS[1], ARGV[2])
end
return 1
"""


class RedisLedger:
    """With Redis: one script per grant and per settle. The spent counter is seeded from the
    spend recorded so far (`seed`) when missing, and kept while the key is in use."""

    def __init__(
        self,
        store: RedisStore,
        clock: Clock,
        divisor: float,
        seed: Callable[[str, str], Awaitable[float]],
        keep: float = 7 * 86_400.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.divisor = divisor
        self.seed = seed
        self.keep_ms = int(keep * 1000)

    @staticmethod
    def _keys(key_id: str, period: str) -> tuple[str, str, str]:
        base = f"ballast:budget:{key_id}:{period}"
        return base + ":spent", base + ":until", base + ":held"

    async def grant(
        self, key_id: str, period: str, budget: float, amount: float, grant_id: str, ttl: float
    ) -> float | None:
        keys = self._keys(key_id, period)
        args = (self.clock.time(), ttl, grant_id, repr(amount), repr(budget), self.divisor)
        try:
            for _ in range(2):
                result = await self.store.call(
                    lambda r: r.eval(_GRANT, 3, *keys, *args, self.keep_ms)
                )
                if result is not None:
                    granted = float(result)
                    return None if granted < 0 else granted
                seed = repr(await self.seed(key_id, period))
                await self.store.call(
                    lambda r, seed=seed: r.set(keys[0], seed, nx=True, px=self.keep_ms)  # type: ignore[misc]
                )
        except StoreUnavailable as exc:
            raise LedgerUnavailable("redis") from exc
        raise LedgerUnavailable("budget counter could not be seeded")

    async def settle(self, key_id: str, period: str, grant_id: str, spent: float) -> None:
        keys = self._keys(key_id, period)
        try:
            await self.store.call(lambda r: r.eval(_SETTLE, 3, *keys, grant_id, repr(spent)))
        except StoreUnavailable as exc:
            raise LedgerUnavailable("redis") from exc

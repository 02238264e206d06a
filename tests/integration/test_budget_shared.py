"""Budgets on real Redis and PostgreSQL: two gateways sharing one Redis and one database
draw on one budget, so 50 requests at once on a three-answer budget get three answers
between them; and a grant left by an instance that died lapses on its own, in Redis as in
the database."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ballast.config import StateSettings
from ballast.resilience.clock import ManualClock
from ballast.sim.server import SimServer
from ballast.state.budget_ledger import Ledger, RedisLedger, SqlLedger
from ballast.state.db import Database
from ballast.state.store import RedisStore
from tests.e2e.test_access import new_key
from tests.e2e.test_budget_concurrency import ANSWER_TOKENS, SLOW_SIM, check_three_answers, config
from tests.stack import Stack

pytestmark = [pytest.mark.integration, SLOW_SIM]


def test_two_instances_on_redis_and_postgres_share_one_budget(
    stack: Stack, sim: SimServer, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    gateways = [
        stack.gateway(
            config(
                sim,
                {
                    "redis_url": redis_url,
                    "database_url": database_url,
                    "spend_journal": str(tmp_path / f"spend-{i}.journal"),
                    "spend_flush_interval": 0.1,
                },
            )
        )
        for i in range(2)
    ]
    key, key_id = new_key(gateways[0], budget=3.0 * ANSWER_TOKENS, budget_period="total")
    check_three_answers(stack, sim, [g.url for g in gateways], key, key_id)


async def _lapses(ledger: Ledger, clock: ManualClock, key_id: str) -> None:
    # Grant ids unique to this run: the database may keep an earlier run's rows.
    run = uuid.uuid4().hex[:8]
    dead, live = f"dead-{run}", [f"live-{run}-{i}" for i in range(4)]
    assert await ledger.grant(key_id, "total", 10.0, 10.0, dead, 60.0) == 10.0
    assert await ledger.grant(key_id, "total", 10.0, 1.0, live[0], 60.0) is None
    clock.advance(61.0)  # the instance holding the dead grant never came back
    assert await ledger.grant(key_id, "total", 10.0, 4.0, live[1], 60.0) is not None
    await ledger.settle(key_id, "total", live[1], 3.0)  # spent 3 of what it held
    granted = await ledger.grant(key_id, "total", 10.0, 7.0, live[2], 60.0)
    assert granted == pytest.approx(7.0)
    assert await ledger.grant(key_id, "total", 10.0, 0.5, live[3], 60.0) is None


async def test_a_dead_instances_grant_lapses_in_postgres(database_url: str) -> None:
    clock = ManualClock()
    db = Database(database_url)
    try:
        await db.upgrade()
        await _lapses(SqlLedger(db, clock, 8.0), clock, "key_lapse_pg_" + str(id(clock)))
    finally:
        await db.close()


async def test_a_dead_instances_grant_lapses_in_redis(redis_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url, StateSettings(redis_url=redis_url), clock)

    async def nothing_spent(key_id: str, period: str) -> float:
        return 0.0

    try:
        ledger = RedisLedger(store, clock, 8.0, nothing_spent)
        await _lapses(ledger, clock, "key_lapse_redis_" + str(id(clock)))
    finally:
        await store.close()


async def test_a_dead_instances_grant_lapses_in_sqlite(tmp_path: Path) -> None:
    clock = ManualClock()
    db = Database(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        await db.upgrade()
        await _lapses(SqlLedger(db, clock, 8.0), clock, "key_lapse")
    finally:
        await db.close()

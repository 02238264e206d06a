"""Spend survives `kill -9` on PostgreSQL: every answer a client got is billed once after a
restart (see tests/e2e/test_spend_crash.py for SQLite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from ballast.state.db import Database
from tests.e2e.test_spend_crash import check, kill_under_load
from tests.stack import Stack

pytestmark = pytest.mark.integration


def test_kill_9_under_load_leaves_no_answer_unbilled_on_postgres(
    stack: Stack, database_url: str, tmp_path: Path
) -> None:
    sim = stack.sim("ok?tokens=2")
    state = {"database_url": database_url, "spend_journal": str(tmp_path / "spend.journal")}
    # Rows of this test only: the key it creates is new, so count that key's events.
    before = asyncio.run(_keys(database_url))
    answered, sim_answered = kill_under_load(stack, sim, tmp_path, state)
    (key_id,) = asyncio.run(_keys(database_url)) - before

    def billed() -> tuple[int, int]:
        return asyncio.run(_billed(database_url, key_id))

    check(answered, sim_answered, billed)


async def _keys(url: str) -> set[str]:
    db = Database(url)
    try:
        await db.upgrade()
        async with db.connect() as connection:
            rows = await connection.execute(sa.text("SELECT id FROM api_keys"))
            return {row[0] for row in rows}
    finally:
        await db.close()


async def _billed(url: str, key_id: str) -> tuple[int, int]:
    db = Database(url)
    try:
        async with db.connect() as connection:
            row = (
                await connection.execute(
                    sa.text(
                        "SELECT count(*), count(DISTINCT id) FROM spend_events WHERE key_id = :k"
                    ),
                    {"k": key_id},
                )
            ).one()
            return int(row[0]), int(row[1])
    finally:
        await db.close()

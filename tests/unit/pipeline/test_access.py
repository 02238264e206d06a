"""Settling an answered request with whatever usage the upstream reported: garbage counts
must neither fail the request nor poison the spend batch (a count the database cannot store
would fail every flush of that batch, and every replay of its journal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ballast.config import Settings
from ballast.pipeline.access import Access, token_counts
from ballast.pipeline.context import Ticket
from ballast.resilience.clock import ManualClock
from ballast.state.db import Database
from ballast.state.keys import KeyRecord, KeyService
from ballast.state.ratelimit import RateLimiter
from ballast.state.schema import spend_events
from ballast.state.spend import SpendEvent, SpendRecorder

MAX_COUNT = 2**31 - 1  # PostgreSQL's INTEGER


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 5}, (12, 5)),
        ({"prompt_tokens": 12.0, "completion_tokens": None}, (12, 0)),
        ({"prompt_tokens": "12", "completion_tokens": "many"}, (0, 0)),
        ({"prompt_tokens": -3, "completion_tokens": True}, (0, 0)),
        ({"prompt_tokens": float("inf"), "completion_tokens": float("nan")}, (0, 0)),
        ({"prompt_tokens": [1], "completion_tokens": {"n": 1}}, (0, 0)),
        ({"prompt_tokens": 10**30, "completion_tokens": 1e300}, (MAX_COUNT, MAX_COUNT)),
        ({}, (0, 0)),
        ("usage", (0, 0)),
        (None, (0, 0)),
    ],
)
def test_token_counts_take_only_sane_numbers(usage: Any, expected: tuple[int, int]) -> None:
    assert token_counts(usage) == expected


async def test_garbage_usage_is_settled_and_flushed(db: Database, tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "server": {"master_key": "sk-master-0123456789"},
            "prices": {"m": {"input": 1.0}},
            "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]}],
        }
    )
    spend = SpendRecorder(db, None, str(tmp_path / "spend.journal"))
    access = Access(settings, KeyService(db), RateLimiter(None), spend)
    key = KeyRecord(id="k1", name="test", tpm=1000)
    for usage in (
        {"prompt_tokens": "lots", "completion_tokens": [2]},
        {"prompt_tokens": 10**30, "completion_tokens": float("nan")},
    ):
        access.settle(Ticket(key, None, 0), "m", usage, None)
    await spend.flush()
    assert spend.pending_events == 0  # written, not stuck in memory or a journal
    async with db.connect() as connection:
        rows = (
            await connection.execute(
                sa.select(spend_events.c.prompt_tokens, spend_events.c.completion_tokens)
            )
        ).all()
    assert sorted(tuple(row) for row in rows) == [(0, 0), (MAX_COUNT, 0)]


async def test_a_settled_answer_is_one_complete_spend_row(db: Database, tmp_path: Path) -> None:
    """What settling records, column by column (it records a plain tuple in column order)."""
    settings = Settings.model_validate(
        {
            "server": {"master_key": "sk-master-0123456789"},
            "prices": {"m": {"input": 1.0, "output": 2.0}},
            "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]}],
        }
    )
    clock = ManualClock(start=0.0, wall_offset=1_796_083_200.0)  # 2026-12-01T00:00:00Z
    spend = SpendRecorder(db, None, str(tmp_path / "spend.journal"), clock=clock)
    access = Access(settings, KeyService(db), RateLimiter(None), spend, clock=clock)
    key = KeyRecord(id="k1", name="test", budget=5.0, budget_period="day")
    usage = {"prompt_tokens": 12, "completion_tokens": 5}
    access.settle(Ticket(key, None, 0), "m", usage, "dep-a")
    access.settle(Ticket(key, None, 0), "m", usage, None, cached=True)
    await spend.flush()
    async with db.connect() as connection:
        rows = (await connection.execute(sa.select(spend_events))).all()
    first, second = sorted(SpendEvent(*row) for row in rows)
    assert first._replace(id="") == SpendEvent(
        "", "k1", "2026-12-01", "m", "dep-a", 12, 5, 22 / 1_000_000, False, clock.time()
    )
    assert second._replace(id="") == SpendEvent(
        "", "k1", "2026-12-01", "m", None, 12, 5, 0.0, True, clock.time()
    )
    assert first.id < second.id  # one process's ids sort in the order it recorded them

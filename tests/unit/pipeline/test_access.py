"""Settling an answered request with whatever usage the upstream reported: garbage counts
must neither fail the request nor poison the spend batch (a count the database cannot store
would fail every flush of that batch, and every replay of its journal)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from ballast.config import Settings
from ballast.pipeline.access import Access
from ballast.pipeline.context import RequestContext, Ticket
from ballast.pipeline.errors import ApiError
from ballast.resilience.clock import ManualClock
from ballast.state.db import Database
from ballast.state.keys import KeyRecord, KeyService
from ballast.state.ratelimit import RateLimiter, reset_header
from ballast.state.schema import spend_events
from ballast.state.spend import SpendEvent, SpendRecorder

MAX_COUNT = 2**31 - 1  # PostgreSQL's INTEGER


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
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "prompt_tokens_details": {
            "cached_tokens": 4,
            "cache_write_tokens": 3,
            "cache_write_1h_tokens": 1,
        },
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    access.settle(Ticket(key, None, 0), "m", usage, "dep-a")
    access.settle(Ticket(key, None, 0), "m", usage, None, cached=True)
    await spend.flush()
    async with db.connect() as connection:
        rows = (await connection.execute(sa.select(spend_events))).all()
    first, second = sorted(SpendEvent(*row) for row in rows)
    # No cache prices: reads and writes cost the input price; the parts are kept all the same.
    assert first._replace(id="") == SpendEvent(
        "", "k1", "2026-12-01", "m", "dep-a", 12, 5, 22 / 1_000_000, False, clock.time(),
        False, 4, 3, 1, 2,
    )  # fmt: skip
    assert second._replace(id="") == SpendEvent(
        "", "k1", "2026-12-01", "m", None, 12, 5, 0.0, True, clock.time(), False, 4, 3, 1, 2
    )
    assert first.id < second.id  # one process's ids sort in the order it recorded them


async def test_a_rate_limit_refusal_says_the_limit_and_the_wait(
    db: Database, tmp_path: Path
) -> None:
    """Each kind of refusal names its limit and the wait; Retry-After says the same wait,
    whole seconds rounded up, and so does the refusing limit's x-ratelimit-reset header."""
    settings = Settings.model_validate(
        {
            "server": {"master_key": "sk-master-0123456789"},
            "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]}],
        }
    )
    clock = ManualClock(start=60 * 16_667 + 20.0)  # 20 s into a window
    spend = SpendRecorder(db, None, str(tmp_path / "spend.journal"), clock=clock)
    access = Access(settings, KeyService(db), RateLimiter(None, clock=clock), spend, clock=clock)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}

    def request() -> RequestContext:
        return RequestContext("/chat/completions", payload, b"x" * 40, "m", False)

    async def refused(key: KeyRecord) -> ApiError:
        with pytest.raises(ApiError) as caught:
            await access.admit(key, request())
        assert caught.value.status == 429 and caught.value.code == "rate_limit_exceeded"
        return caught.value

    rpm = KeyRecord(id="k-rpm", name="rpm", rpm=1)
    await access.admit(rpm, request())
    error = await refused(rpm)
    headers = dict(error.headers)
    assert headers[b"retry-after"] == b"100"  # the first window's request ages out at 120 s
    assert headers[b"x-ratelimit-reset-requests"] == b"1m40s"
    assert error.message == (
        "Rate limit reached for requests on this key: 1 requests per minute. Retry in 100 s."
    )

    tpm = KeyRecord(id="k-tpm", name="tpm", tpm=30)
    await access.admit(tpm, request())  # 40 bytes / 4 + 10 asked = 20 tokens
    error = await refused(tpm)
    headers = dict(error.headers)
    assert headers[b"x-ratelimit-reset-tokens"] == reset_header(int(headers[b"retry-after"]))
    assert error.message.startswith("Rate limit reached for tokens on this key: 30 tokens per")

    parallel = KeyRecord(id="k-par", name="par", max_parallel=1)
    await access.admit(parallel, request())
    error = await refused(parallel)
    assert error.message.startswith(
        "Rate limit reached for parallel on this key: 1 requests at once. Retry in "
    )
    assert int(dict(error.headers)[b"retry-after"]) >= 1

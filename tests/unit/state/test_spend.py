"""Spend: batching, backoff, the journal, shutdown and crashes, on a real SQLite file.

Database failures are injected at the database boundary: the Database's engine is swapped
for one whose file cannot be opened, so the driver itself fails."""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from ballast.config import ModelPrice
from ballast.resilience.clock import ManualClock
from ballast.state import spend_buffer
from ballast.state.db import Database
from ballast.state.schema import spend_events, spend_totals
from ballast.state.spend import (
    EventBuffer,
    SpendEvent,
    SpendRecorder,
    SpendUnavailable,
    cost_of,
    new_event_id,
    period_of,
)
from ballast.state.spend_buffer import _EVENT_COLUMNS
from ballast.state.spend_wal import read_segment
from ballast.stream.usage import Usage
from ballast.stream.usage import read as read_usage

INTERVAL = 1.0


class FlakyDatabase(Database):
    """A real SQLite database whose engine can be switched to one that cannot open its file."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"sqlite+aiosqlite:///{path}")
        self._good = self.engine
        self._bad = create_async_engine(
            f"sqlite+aiosqlite:///{path.parent / 'no-such-dir' / 'x.db'}"
        )
        self.begins: list[float] = []
        self.connects = 0
        self.clock: ManualClock | None = None

    def set_down(self, down: bool) -> None:
        self.engine = self._bad if down else self._good

    def begin(self) -> Any:
        self.begins.append(self.clock.monotonic() if self.clock else time.monotonic())
        return super().begin()

    def connect(self) -> Any:
        self.connects += 1
        return super().connect()

    async def close(self) -> None:
        await self._bad.dispose()
        await self._good.dispose()


@pytest.fixture
async def db(tmp_path: Path, clock: ManualClock) -> AsyncIterator[FlakyDatabase]:
    database = FlakyDatabase(tmp_path / "spend.db")
    database.clock = clock
    await database.upgrade()
    yield database
    await database.close()


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal-dir" / "spend.journal"


@pytest.fixture
def make_recorder(
    db: FlakyDatabase, journal: Path, clock: ManualClock
) -> Iterator[Callable[..., SpendRecorder]]:
    made: list[SpendRecorder] = []

    def make(**overrides: Any) -> SpendRecorder:
        options: dict[str, Any] = {
            "flush_interval": INTERVAL,
            "clock": clock,
            "max_backoff": 8.0,
            "rng": random.Random(7),
        }
        options.update(overrides)
        recorder = SpendRecorder(db, None, str(journal), **options)
        made.append(recorder)
        return recorder

    yield make
    for recorder in made:  # abandoned recorders must not act after the test
        if recorder._task is not None:
            recorder._task.cancel()


def event(key: str = "k1", cost: float = 0.25, period: str = "total") -> SpendEvent:
    return SpendEvent(
        id=new_event_id(),
        key_id=key,
        period=period,
        model="gpt-x",
        deployment="dep-a",
        prompt_tokens=10,
        completion_tokens=5,
        cost=cost,
        cached=False,
        created_at=1_700_000_000.0,
    )


async def rows(db: Database) -> list[tuple[str, str, float]]:
    async with db._good.connect() as connection:  # type: ignore[attr-defined]
        result = await connection.execute(
            sa.select(spend_events.c.id, spend_events.c.key_id, spend_events.c.cost)
        )
        return [(r.id, r.key_id, r.cost) for r in result]


def read(path: Path) -> bytes:
    return path.read_bytes()


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def journal_ids(journal: Path) -> list[str]:
    ids: list[str] = []
    for path in (journal, journal.with_name(journal.name + ".replay")):
        if path.exists():
            ids += [orjson.loads(line)["id"] for line in path.read_bytes().splitlines() if line]
    return ids


async def settle(clock: ManualClock, recorder: SpendRecorder) -> None:
    """Let the flusher run whatever the last clock move woke, to completion, until it is
    asleep on the clock again."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for _ in range(5):
            await asyncio.sleep(0)
        tick, attempt = recorder._tick_task, recorder._attempt
        idle = (tick is None or tick.done()) and (attempt is None or attempt.done())
        asleep = any(when > clock.monotonic() for when in clock.pending)
        if idle and (asleep or recorder._task is None or recorder._task.done()):
            return
        await asyncio.sleep(0.002)
    raise AssertionError("flusher did not settle")


async def advance(clock: ManualClock, recorder: SpendRecorder, seconds: float) -> None:
    """Move time one flush interval at a time, letting each tick finish."""
    steps = round(seconds / INTERVAL)
    for _ in range(steps):
        clock.advance(INTERVAL)
        await settle(clock, recorder)


# -- pure functions --------------------------------------------------------------------


def test_cost_of() -> None:
    prices = {"gpt-x": ModelPrice(input=2.5, output=10.0), "free": ModelPrice()}
    assert cost_of(prices, "gpt-x", Usage(1_000_000, 0)) == 2.5
    assert cost_of(prices, "gpt-x", Usage(1000, 500)) == pytest.approx(0.0025 + 0.005)
    assert cost_of(prices, "free", Usage(1000, 1000)) == 0.0
    assert cost_of(prices, "unknown", Usage(1000, 1000)) == 0.0
    # Reasoning is part of the completion: priced once, as output.
    assert cost_of(prices, "gpt-x", Usage(0, 500, reasoning=400)) == pytest.approx(0.005)


def test_cache_writes_cost_what_the_provider_bills() -> None:
    price = ModelPrice(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
    hourly = price.model_copy(update={"cache_write_1h": 6.0})
    prices = {"claude": price, "hourly": hourly, "plain": ModelPrice(input=3.0)}
    # 1,000 prompt tokens: 600 fresh, 100 read, 200 written for 5 minutes, 100 for an hour.
    usage = {
        "input_tokens": 600,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 300,
        "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 100},
    }
    counts = read_usage(usage)
    assert counts == Usage(1000, 0, 100, 300, 100)
    dollars = (600 * 3.0 + 100 * 0.3 + 200 * 3.75 + 100 * 3.75) / 1e6  # 1h: cache_write
    assert cost_of(prices, "claude", counts) == pytest.approx(dollars)
    dollars = (600 * 3.0 + 100 * 0.3 + 200 * 3.75 + 100 * 6.0) / 1e6
    assert cost_of(prices, "hourly", counts) == pytest.approx(dollars)
    assert cost_of(prices, "plain", counts) == pytest.approx(3000 / 1e6)


def test_period_of_is_utc() -> None:
    # 2024-01-31 23:30 UTC: still January 31st in UTC, whatever the local zone says.
    now = 1706743800.0
    assert period_of("day", now) == "2024-01-31"
    assert period_of("month", now) == "2024-01"
    assert period_of("day", now + 3600) == "2024-02-01"
    assert period_of("month", now + 3600) == "2024-02"
    assert period_of("total", now) == "total"
    with pytest.raises(ValueError):
        period_of("week", now)
    midnight = 1706745600.0  # 2024-02-01 00:00 UTC: the last instant before it is January
    assert period_of("day", midnight - 0.001) == "2024-01-31"
    assert period_of("month", midnight - 0.001) == "2024-01"
    assert period_of("day", midnight) == "2024-02-01"
    assert period_of("month", midnight) == "2024-02"


# -- batching --------------------------------------------------------------------------


async def test_record_is_buffered_and_flushed_in_one_transaction(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder], clock: ManualClock
) -> None:
    recorder = make_recorder()
    await recorder.start()
    events = [event(cost=0.125 * (i % 4)) for i in range(200)]
    for e in events:
        recorder.record(e)
    assert await rows(db) == []
    assert recorder.unflushed("k1", "total") == pytest.approx(sum(e.cost for e in events))
    before = len(db.begins)

    await advance(clock, recorder, INTERVAL)  # the flusher's tick

    assert len(db.begins) == before + 1  # one transaction for the whole batch
    assert sorted(r[0] for r in await rows(db)) == sorted(e.id for e in events)
    assert recorder.unflushed("k1", "total") == 0.0
    assert recorder.pending_events == 0
    assert await recorder.key_spend("k1", "total") == pytest.approx(sum(e.cost for e in events))
    assert await recorder.key_spend("other", "total") == 0.0

    await advance(clock, recorder, 3 * INTERVAL)  # idle: no database traffic
    assert len(db.begins) == before + 1
    await recorder.close()


async def test_key_spend_adds_unflushed_and_separates_periods(
    make_recorder: Callable[..., SpendRecorder],
) -> None:
    recorder = make_recorder()
    await recorder.start()
    recorder.record(event(cost=1.0, period="2024-01"))
    await recorder.flush()
    recorder.record(event(cost=0.5, period="2024-01"))
    recorder.record(event(cost=7.0, period="2024-02"))
    assert recorder.unflushed("k1", "2024-01") == 0.5
    assert await recorder.key_spend("k1", "2024-01") == 1.5
    assert await recorder.key_spend("k1", "2024-02") == 7.0
    await recorder.close()
    assert await recorder.key_spend("k1", "2024-01") == 1.5


async def test_a_flush_that_commits_while_spend_is_read_counts_once(
    make_recorder: Callable[..., SpendRecorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unflushed figure is taken before the total is read: a flush committing in
    between must not leave its batch in both."""
    recorder = make_recorder()
    await recorder.start()
    recorder.record(event(cost=2.0))
    read_total = recorder._committed_total
    flushed_meanwhile = False

    async def total_while_a_flush_commits(kp: Any) -> float:
        nonlocal flushed_meanwhile
        if not flushed_meanwhile:
            flushed_meanwhile = True
            await recorder.flush()
        return await read_total(kp)

    monkeypatch.setattr(recorder, "_committed_total", total_while_a_flush_commits)
    assert await recorder.key_spend("k1", "total") == 2.0
    assert flushed_meanwhile
    await recorder.close()


async def test_duplicate_ids_are_written_once(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    await recorder.start()
    e = event(cost=2.0)
    recorder.record(e)
    await recorder.flush()
    recorder.record(e)  # a replayed event: the id makes it a no-op
    await recorder.flush()
    assert [r[0] for r in await rows(db)] == [e.id]
    assert await recorder.key_spend("k1", "total") == 2.0
    assert recorder.rechecks == 1  # the fast write found it there and checked every id
    await recorder.close()


async def test_an_event_recorded_twice_in_one_batch_counts_once(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    await recorder.start()
    first, twice = event(cost=1.0), event(cost=2.0)
    for e in (first, twice, twice):
        recorder.record(e)
    await recorder.flush()
    assert sorted(r[0] for r in await rows(db)) == sorted([first.id, twice.id])
    assert await recorder.key_spend("k1", "total") == 3.0
    await recorder.close()


async def test_fresh_events_take_the_fast_write(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    await recorder.start()
    events = [event(cost=0.5) for _ in range(600)]
    for e in events:
        recorder.record(e)
    await recorder.flush()
    assert len(await rows(db)) == 600
    assert await recorder.key_spend("k1", "total") == 300.0
    assert recorder.rechecks == 0
    await recorder.close()


# -- failures --------------------------------------------------------------------------


async def test_failed_flush_keeps_the_batch_and_backs_off(
    db: FlakyDatabase,
    make_recorder: Callable[..., SpendRecorder],
    clock: ManualClock,
    journal: Path,
) -> None:
    recorder = make_recorder(max_backoff=8.0)
    await recorder.start()
    recorder.record(event(cost=1.0))
    await recorder.flush()
    assert await recorder.key_spend("k1", "total") == 1.0  # a known sum, cached
    db.set_down(True)
    recorded: list[SpendEvent] = []
    attempts_before = len(db.begins)

    for _ in range(40):  # 40 s of steady traffic while the database is down
        batch = [event(cost=0.5) for _ in range(3)]
        recorded += batch
        for e in batch:
            recorder.record(e)
        await advance(clock, recorder, INTERVAL)
        # Every tick leaves memory empty: the batch is in the journal, fsync'd.
        assert recorder.pending_events == 0

    attempts = db.begins[attempts_before:]
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert 5 <= len(attempts) <= 15, attempts  # backed off, not one attempt per second
    assert gaps[:3] == sorted(gaps[:3])  # growing...
    assert max(gaps) <= 8.0 + INTERVAL  # ...up to max_backoff (plus tick granularity)
    assert await rows(db) != []  # only the one event flushed before the outage
    assert len(await rows(db)) == 1
    assert sorted(journal_ids(journal)) == sorted(e.id for e in recorded)
    assert recorder.unflushed("k1", "total") == pytest.approx(0.5 * len(recorded))

    # While the database is known down, budget checks make no database calls: the last
    # known sum plus what is unflushed.
    connects = db.connects
    assert await recorder.key_spend("k1", "total") == pytest.approx(1.0 + 0.5 * len(recorded))
    assert db.connects == connects

    db.set_down(False)
    await advance(clock, recorder, 10 * INTERVAL)
    ids = [r[0] for r in await rows(db)]
    assert len(ids) == len(set(ids)) == len(recorded) + 1
    assert set(ids) >= {e.id for e in recorded}
    assert journal_ids(journal) == []
    assert recorder.unflushed("k1", "total") == 0.0
    assert recorder.failures == 0
    assert await recorder.key_spend("k1", "total") == pytest.approx(1.0 + 0.5 * len(recorded))
    await recorder.close()


async def test_key_spend_without_any_known_total_says_so(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    await recorder.start()
    db.set_down(True)
    with pytest.raises(SpendUnavailable):
        await recorder.key_spend("never-seen", "total")
    assert recorder.unflushed("never-seen", "total") == 0.0
    db.set_down(False)
    await recorder.close()


async def test_journal_is_replayed_exactly_once(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder], journal: Path
) -> None:
    first = make_recorder()
    await first.start()
    db.set_down(True)
    events = [event(cost=0.75) for _ in range(20)]
    for e in events:
        first.record(e)
    await first.flush()  # fails: spilled
    saved = read(journal)
    db.set_down(False)
    await first.flush()  # replayed and removed
    assert journal_ids(journal) == []
    assert sorted(r[0] for r in await rows(db)) == sorted(e.id for e in events)
    await first.close()

    # A crash between the commit and the journal's removal: the same journal again.
    write(journal, saved)
    second = make_recorder()
    assert second.unflushed("k1", "total") == 0.0
    await second.start()
    ids = [r[0] for r in await rows(db)]
    assert sorted(ids) == sorted(e.id for e in events)  # no duplicates
    assert await second.key_spend("k1", "total") == pytest.approx(0.75 * 20)
    assert journal_ids(journal) == []
    await second.close()


async def test_a_torn_journal_line_loses_only_itself(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder], journal: Path
) -> None:
    good = event(cost=1.0)
    write(journal, orjson.dumps(good.row()) + b"\n" + b'{"id": "torn", "key_')
    db.set_down(True)
    recorder = make_recorder()
    await recorder.start()  # database down at start: starts anyway, keeps the journal
    later = event(cost=2.0)
    recorder.record(later)
    await recorder.flush()  # spills after the torn line without merging into it
    db.set_down(False)
    await recorder.flush()
    assert sorted(r[0] for r in await rows(db)) == sorted([good.id, later.id])
    await recorder.close()


# -- shutdown and crashes --------------------------------------------------------------


async def test_close_flushes_everything(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    await recorder.start()
    events = [event(cost=0.5) for _ in range(50)]
    for e in events:
        recorder.record(e)
    await recorder.close()
    assert sorted(r[0] for r in await rows(db)) == sorted(e.id for e in events)
    assert recorder._task is None


async def test_close_with_the_database_down_journals_everything(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder], journal: Path
) -> None:
    recorder = make_recorder()
    await recorder.start()
    events = [event(cost=0.5) for _ in range(50)]
    for e in events:
        recorder.record(e)
    db.set_down(True)
    await recorder.close()
    assert await rows(db) == []
    assert sorted(journal_ids(journal)) == sorted(e.id for e in events)

    db.set_down(False)
    restarted = make_recorder()
    await restarted.start()
    assert restarted.unflushed("k1", "total") == 0.0
    assert sorted(r[0] for r in await rows(db)) == sorted(e.id for e in events)
    await restarted.close()


async def test_kill_9_loses_nothing_recorded(
    db: FlakyDatabase,
    make_recorder: Callable[..., SpendRecorder],
    clock: ManualClock,
    journal: Path,
    tmp_path: Path,
) -> None:
    victim = make_recorder()
    await victim.start()
    recorded: list[SpendEvent] = []

    def traffic(n: int) -> None:
        for _ in range(n):
            e = event(cost=0.25)
            recorded.append(e)
            victim.record(e)

    traffic(10)
    await advance(clock, victim, INTERVAL)  # committed
    db.set_down(True)
    traffic(10)
    await advance(clock, victim, INTERVAL)  # the attempt fails: journaled
    traffic(10)
    await advance(clock, victim, INTERVAL)  # backing off: journaled
    traffic(7)  # arrived within the last interval: in memory and the write-ahead log
    assert victim.pending_events == 7

    # kill -9: nothing more runs in that process; only its files survive.
    snapshot = tmp_path / "after-crash"
    shutil.copytree(journal.parent, snapshot)
    victim._task.cancel()  # type: ignore[union-attr]
    shutil.rmtree(journal.parent)
    shutil.copytree(snapshot, journal.parent)

    db.set_down(False)
    survivor = make_recorder()
    await survivor.start()
    stored = [r[0] for r in await rows(db)]
    assert sorted(stored) == sorted(e.id for e in recorded)  # each once
    assert journal_ids(journal) == []
    await survivor.close()
    assert not list(journal.parent.glob("*.wal.*"))  # a clean shutdown leaves no segment


async def test_spill_failure_keeps_events_in_memory(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the journal's directory should be")
    recorder = make_recorder()
    recorder.journal = blocker / "spend.journal"
    recorder.replay_journal = blocker / "spend.journal.replay"
    recorder.record(event(cost=3.0))
    db.set_down(True)
    await recorder.flush()  # the database and the journal both fail: keep it
    assert recorder.pending_events == 1
    assert recorder.unflushed("k1", "total") == 3.0
    db.set_down(False)
    await recorder.flush()
    assert recorder.pending_events == 0
    assert len(await rows(db)) == 1


async def test_a_commit_whose_answer_was_lost_is_not_counted_twice(
    db: FlakyDatabase,
    make_recorder: Callable[..., SpendRecorder],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("no journal: the batch stays in memory and is tried again")
    recorder = make_recorder()
    recorder.journal = blocker / "spend.journal"
    recorder.replay_journal = blocker / "spend.journal.replay"
    write = recorder._write
    answers_lost = [True]

    async def committed_but_unanswered(checked: Any, fresh: Any) -> Any:
        inserted = await write(checked, fresh)
        if answers_lost.pop() if answers_lost else False:
            raise ConnectionError("the commit's answer was lost")
        return inserted

    monkeypatch.setattr(recorder, "_write", committed_but_unanswered)
    recorder.record(event(cost=3.0))
    await recorder.flush()
    assert recorder.pending_events == 1  # the database has it; this process cannot know
    recorder.record(event(cost=1.0))
    await recorder.flush()  # the fast write finds the first there: all are checked
    assert recorder.pending_events == 0
    assert len(await rows(db)) == 2
    assert await recorder.key_spend("k1", "total") == 4.0
    assert recorder.rechecks == 1


def test_an_event_row_has_every_field_and_reads_back() -> None:
    event = SpendEvent("e-1", "k", "total", "m", None, 9, 7, 0.25, True, 1.5)
    row = event.row()
    assert set(row) == set(SpendEvent._fields)
    assert SpendEvent.from_row(row) == event
    estimated = event._replace(estimated=True)
    assert SpendEvent.from_row(estimated.row()) == estimated


def test_a_write_ahead_log_line_from_before_estimates_reads_back_as_reported(
    tmp_path: Path,
) -> None:
    segment = tmp_path / "old.wal"
    old = ["e-1", "k", "total", "m", None, 9, 7, 0.25, False, 1.5]  # ten values, no `estimated`
    new = [*old[:9], 2.5, True]
    segment.write_bytes(orjson.dumps(old) + b"\n" + orjson.dumps(new) + b"\n")
    first, second = read_segment(segment)
    assert not first.estimated and first.created_at == 1.5
    assert second.estimated and second.created_at == 2.5


async def _totals(db: Database) -> dict[tuple[str, str], float]:
    async with db.connect() as connection:
        rows = (await connection.execute(sa.select(spend_totals))).all()
    return {(row.key_id, row.period): row.cost for row in rows}


async def _sums(db: Database) -> dict[tuple[str, str], float]:
    query = sa.select(
        spend_events.c.key_id, spend_events.c.period, sa.func.sum(spend_events.c.cost)
    ).group_by(spend_events.c.key_id, spend_events.c.period)
    async with db.connect() as connection:
        rows = (await connection.execute(query)).all()
    return {(key, period): total for key, period, total in rows}


async def test_totals_count_each_inserted_event_once(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    events = [event("k1", 0.25), event("k1", 0.5), event("k2", 1.0, "2026-11")]
    for e in events:
        recorder.record(e)
    await recorder.flush()
    for e in events[:2]:  # a replay of events already written (a crash before truncate)
        recorder.record(e)
    recorder.record(event("k1", 0.125))
    await recorder.flush()
    totals = await _totals(db)
    assert totals == pytest.approx(await _sums(db))
    assert totals == pytest.approx({("k1", "total"): 0.875, ("k2", "2026-11"): 1.0})
    assert await recorder.key_spend("k1", "total") == pytest.approx(0.875)


OF_0002 = _EVENT_COLUMNS[: _EVENT_COLUMNS.index("estimated")]  # the columns it had


async def test_upgrading_an_older_database_fills_the_totals_in(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    from ballast.state.db import MIGRATIONS

    database = Database(f"sqlite:///{tmp_path / 'old.db'}")

    def to_0002(connection: sa.Connection) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.upgrade(config, "0002")

    def as_of_0002(row: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in row.items() if name in OF_0002}

    async with database.begin() as connection:
        await connection.run_sync(to_0002)
        await connection.execute(
            spend_events.insert(),
            [as_of_0002(event("old", 0.25).row()), as_of_0002(event("old", 2.0).row())],
        )
    await database.upgrade()
    assert await _totals(database) == pytest.approx({("old", "total"): 2.25})
    await database.close()


async def test_a_large_batch_is_written_whole(
    db: FlakyDatabase, make_recorder: Callable[..., SpendRecorder]
) -> None:
    recorder = make_recorder()
    for _ in range(600):
        recorder.record(event("big", 0.5))
    await recorder.flush()
    assert await _totals(db) == pytest.approx({("big", "total"): 300.0})
    assert await _sums(db) == pytest.approx({("big", "total"): 300.0})


def test_the_insert_names_every_column_of_the_table_in_row_order() -> None:
    event = SpendEvent("e1", "k1", "total", "m", "d", 1, 2, 0.5, False, 1.0)
    assert _EVENT_COLUMNS == tuple(column.name for column in spend_events.columns)
    assert dict(zip(_EVENT_COLUMNS, event, strict=True)) == event.row()


def odd_events() -> list[SpendEvent]:
    """Events whose strings and numbers a JSON round trip could get wrong."""
    models = ["gpt-x", 'q"uote\\back\nline][', "modèle-日本", "tab\there"]
    return [
        SpendEvent(
            f"e-{i}",
            "k1" if i % 3 else "k2",
            "total" if i % 2 else "2026-12",
            models[i % len(models)],
            None if i % 2 else f"dep-{i}",
            i,
            2**31 - 1 - i,
            0.1 * i + 1e-17,
            bool(i % 2),
            1_764_550_000.123456 + i,
        )
        for i in range(40)
    ]


def test_an_event_buffer_gives_back_what_it_was_given_in_order() -> None:
    events = odd_events()
    older, newer = EventBuffer(), EventBuffer()
    for e in events[:25]:
        older.add(e)
    for e in events[25:]:
        newer.add(e)
    older.absorb(newer)
    assert (len(older), len(newer), newer.totals) == (40, 0, {})
    assert older.events() == events
    expected: dict[tuple[str, str], float] = {}
    for e in events:
        expected[(e.key_id, e.period)] = expected.get((e.key_id, e.period), 0.0) + e.cost
    assert older.totals == pytest.approx(expected)


def test_an_event_buffer_splits_its_json_into_bounded_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spend_buffer, "JSON_CHUNK_BYTES", 300)
    events = odd_events()
    buffer = EventBuffer()
    for e in events:
        buffer.add(e)
    arrays = list(buffer.json_arrays())
    assert len(arrays) > 5
    assert sum(count for _, count in arrays) == len(events)
    decoded = [row for text, count in arrays for row in orjson.loads(text)]
    assert [SpendEvent._make(row) for row in decoded] == events
    assert all(len(orjson.loads(text)) == count for text, count in arrays)


def test_a_string_no_database_could_store_is_kept_with_a_stand_in() -> None:
    buffer = EventBuffer()
    odd = SpendEvent("e-1", "k1", "total", "bad\ud800model", None, 1, 2, 0.5, False, 1.0)
    buffer.add(odd)
    assert buffer.events() == [odd._replace(model="bad?model")]


async def test_events_read_back_from_the_database_as_they_were_recorded(
    db: FlakyDatabase,
    make_recorder: Callable[..., SpendRecorder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spend_buffer, "JSON_CHUNK_BYTES", 500)  # several statements
    recorder = make_recorder()
    events = odd_events()
    for e in events:
        recorder.record(e)
    await recorder.flush()
    async with db.connect() as connection:
        result = await connection.execute(sa.select(spend_events).order_by(spend_events.c.id))
        stored = [SpendEvent(*row) for row in result]
    assert stored == sorted(events)
    assert all(type(e.cached) is bool and type(e.created_at) is float for e in stored)
    assert recorder.rechecks == 0
    assert await _totals(db) == pytest.approx(await _sums(db))

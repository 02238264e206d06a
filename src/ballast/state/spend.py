"""Spend: every response's cost, batched to the database, never lost.

The hot path calls `SpendRecorder.record()` (sync, O(1)); a background task flushes the
buffer every `flush_interval`. The rules, against the known ways gateways lose spend:

- A batch is written in one transaction, idempotent on the event id, and leaves memory only
  once the commit succeeded (or once it is fsync'd to the journal). Nothing is popped before
  the write is known to be durable.
- While the database is down, each tick spills the buffer to a local append-only journal
  (JSON lines, fsync'd), so memory stays bounded and a `kill -9` loses at most what arrived
  since the last tick. Database attempts back off exponentially (with jitter) meanwhile.
- On recovery the journal is replayed in the same transaction as the buffer; ids make a
  replay after a partial failure (or a crash between commit and truncate) harmless, and
  only rows actually inserted count towards the shared Redis counters.
- `close()` (SIGTERM) flushes everything to the database, or to the journal if it is down.

With Redis, each commit adds the inserted costs to `ballast:spend:{key_id}:{period}` so all
instances read one spend per key. A counter is only ever created by a seed from the
database sum (SET NX with an expiry); increments never create one, so a counter can never
start from a partial delta, and any drift (a lost increment, a seed racing a commit) ends
when the counter expires and is seeded again. The database is the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa

from ballast.config import ModelPrice
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.db import Database
from ballast.state.schema import spend_events, spend_totals
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.spend")

PERIODS = ("total", "day", "month")
COUNTER_PREFIX = "ballast:spend:"

# Add to a counter only when it exists: a counter is born from a full database sum, never
# from one batch's delta (that would undercount a key's whole history until it expires).
_INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
end
return false
"""

_KeyPeriod = tuple[str, str]


class SpendEvent(NamedTuple):
    """One response's spend. A tuple in column order: made on every answered request
    (about 0.3 us, against 2 us for a frozen dataclass), and its own row of values."""

    id: str
    key_id: str
    period: str
    model: str
    deployment: str | None
    prompt_tokens: int
    completion_tokens: int
    cost: float
    cached: bool
    created_at: float

    def row(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SpendEvent:
        return cls(
            id=str(row["id"]),
            key_id=str(row["key_id"]),
            period=str(row["period"]),
            model=str(row["model"]),
            deployment=None if row.get("deployment") is None else str(row["deployment"]),
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            cost=float(row["cost"]),
            cached=bool(row["cached"]),
            created_at=float(row["created_at"]),
        )


_EVENT_COLUMNS = SpendEvent._fields

# A `SpendEvent`'s values as a plain tuple, in column order: what the hot path records
# (about 0.3 us less than making the named tuple, which the encoder would copy anyway).
SpendRow = tuple[str, str, str, str, str | None, int, int, float, bool, float]


# The most a single JSON statement of events carries (the last event may pass it): about
# 1,900 events. A second's batch at 7,000 answers a second, as one statement, left the
# worker's peak memory 10 MB higher (transient copies of a megabyte or so, in the driver
# thread too); in statements of this size, no higher than a list of events had.
JSON_CHUNK_BYTES = 256 << 10
_NEWLINE_TO_COMMA = bytes.maketrans(b"\n", b",")


class EventBuffer:
    """Events, each kept as one JSON array in a single growing buffer, with the cost they
    add up to per (key, period).

    Why not a list of events: the database then takes a whole batch as one JSON text, so a
    flush does no work per event in Python, and binds one value instead of ten per event.
    SQLite's driver binds while its thread holds the interpreter lock, which the event
    loop waited on. Measured with the bench's keyed server (SQLite) at 32 connections:
    about 3 % more requests a second, for less CPU per request. Encoding costs about
    0.2 us an event."""

    __slots__ = ("_data", "count", "totals")

    def __init__(self) -> None:
        self._data = bytearray()
        self.count = 0
        self.totals: dict[_KeyPeriod, float] = {}

    def __len__(self) -> int:
        return self.count

    def add(self, event: SpendEvent | SpendRow) -> None:
        row = event if type(event) is tuple else tuple(event)  # the encoder takes no subclass
        try:
            self._data += orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # a string no database could store (a lone surrogate)
            self._data += orjson.dumps(_storable(row), option=orjson.OPT_APPEND_NEWLINE)
        self.count += 1
        kp = (event[1], event[2])  # key_id, period
        self.totals[kp] = self.totals.get(kp, 0.0) + event[7]  # cost

    def absorb(self, newer: EventBuffer) -> None:
        """Move `newer`'s events in after these, leaving it empty."""
        if not self.count:  # the usual case: take its buffer over rather than copy it
            self._data, self.count, self.totals = newer._data, newer.count, newer.totals
        else:
            self._data += newer._data
            self.count += newer.count
            for kp, cost in newer.totals.items():
                self.totals[kp] = self.totals.get(kp, 0.0) + cost
        newer._data, newer.count, newer.totals = bytearray(), 0, {}

    def json_arrays(self) -> Iterator[tuple[str, int]]:
        """The events as JSON arrays of about `JSON_CHUNK_BYTES` at most, with their count.
        JSON escapes every control character inside a string, so each raw newline ends an
        event: the lines, joined by commas, are one array. One copy of the buffer, and one
        text per array."""
        raw = self._data
        view = memoryview(raw.translate(_NEWLINE_TO_COMMA))
        start = 0
        while start < len(raw):
            end = raw.find(b"\n", min(start + JSON_CHUNK_BYTES, len(raw)) - 1)
            count = raw.count(b"\n", start, end) + 1
            yield "".join(("[", str(view[start:end], "utf-8"), "]")), count
            start = end + 1

    def events(self) -> list[SpendEvent]:
        """The events decoded, oldest first."""
        return [
            SpendEvent._make(row) for text, _ in self.json_arrays() for row in orjson.loads(text)
        ]


def _storable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        v.encode("utf-8", "replace").decode("utf-8") if isinstance(v, str) else v for v in row
    )


@functools.cache
def _insert_sql(sqlite: bool, returning: bool) -> str:
    """Insert the events of one JSON array of rows (see `EventBuffer`), skipping ids already
    there; `returning`: with (key_id, period, cost) of what was inserted (PostgreSQL adds
    them up per key and period itself). Two statements per database, whatever the batch
    sizes, so the driver's statement cache stays small. SQLite's `json_extract` parses
    each row once (it caches the parse); PostgreSQL's `->>` reads the parsed array."""
    if sqlite:
        picks = ",".join(f"json_extract(value,'$[{i}]')" for i in range(len(_EVENT_COLUMNS)))
        source = "json_each(?) WHERE true"  # `WHERE`: an upsert's SELECT needs one in SQLite
    else:
        casts = ("", "", "", "", "", "::int", "::int", "::float8", "::boolean", "::float8")
        picks = ",".join(f"(r->>{i}){cast}" for i, cast in enumerate(casts))
        source = "json_array_elements($1::json) AS r"
    insert = (
        f"INSERT INTO {spend_events.name} ({','.join(_EVENT_COLUMNS)}) "
        f"SELECT {picks} FROM {source} ON CONFLICT (id) DO NOTHING"
    )
    if not returning:
        return insert
    if sqlite:
        return insert + " RETURNING key_id, period, cost"
    return (
        f"WITH added AS ({insert} RETURNING key_id, period, cost) "
        "SELECT key_id, period, sum(cost) FROM added GROUP BY key_id, period"
    )


def _buffered(events: Iterable[SpendEvent]) -> EventBuffer:
    buffer = EventBuffer()
    for event in events:
        buffer.add(event)
    return buffer


class _AlreadyThere(Exception):
    """A fresh event's id was in the database after all (recorded twice)."""


class SpendUnavailable(Exception):
    """Neither Redis nor the database can give a key's spend, and none is cached."""


def new_event_id() -> str:
    return uuid.uuid4().hex


def cost_of(
    prices: Mapping[str, ModelPrice], model: str, prompt_tokens: int, completion_tokens: int
) -> float:
    """Dollars for one response; prices are per million tokens. An unpriced model costs 0."""
    price = prices.get(model)
    if price is None:
        return 0.0
    # Conditionals, not max(): this runs for every answer, and each builtin call costs more.
    prompt = prompt_tokens if prompt_tokens > 0 else 0
    completion = completion_tokens if completion_tokens > 0 else 0
    return (prompt * price.input + completion * price.output) / 1_000_000


def period_of(budget_period: str, now: float) -> str:
    """The period bucket a spend at wall-clock `now` falls in (UTC)."""
    if budget_period == "total":
        return "total"
    # Asked twice a request; a UTC day is 86,400 s of POSIX time, so the day decides.
    return _period_of_day(budget_period, int(now // 86_400))


@functools.lru_cache(maxsize=8)
def _period_of_day(budget_period: str, day: int) -> str:
    when = time.gmtime(day * 86_400)
    if budget_period == "day":
        return time.strftime("%Y-%m-%d", when)
    if budget_period == "month":
        return time.strftime("%Y-%m", when)
    raise ValueError(f"unknown budget period {budget_period!r} (expected one of {PERIODS})")


def counter_name(key_id: str, period: str) -> str:
    return f"{COUNTER_PREFIX}{key_id}:{period}"


class SpendRecorder:
    def __init__(
        self,
        db: Database,
        store: RedisStore | None,
        journal_path: str,
        flush_interval: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
        max_backoff: float = 30.0,
        *,
        counter_ttl: float = 3600.0,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.journal = Path(journal_path)
        self.replay_journal = self.journal.with_name(self.journal.name + ".replay")
        self.flush_interval = flush_interval
        self.clock = clock
        self.max_backoff = max(max_backoff, flush_interval)
        self.counter_ttl = counter_ttl
        self._rng = rng or random.Random()
        # Events only in memory: new ones, and the batch a flush is writing right now.
        self._pending = EventBuffer()
        self._inflight = EventBuffer()
        # Events in the journal files, not yet known to be committed.
        self._journal_totals: dict[_KeyPeriod, float] = {}
        # What this instance committed (inserted rows only), for the cached database sums.
        self._committed: dict[_KeyPeriod, float] = {}
        self._db_sums: dict[_KeyPeriod, tuple[float, float]] = {}
        self._stale_counters: set[str] = set()
        self._flush_lock = asyncio.Lock()
        self._journal_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._attempt: asyncio.Task[None] | None = None
        self._tick_task: asyncio.Future[None] | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.closed = False
        # Counters for status and tests.
        self.db_attempts = 0
        self.spills = 0
        self.rechecks = 0  # batches written again with every id checked (one was there)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Account for (then replay) a journal left by a previous run; start the flusher."""
        if self._task is not None:
            return
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        async with self._journal_lock:
            leftovers = await asyncio.to_thread(self._read_all_journals)
        for event in leftovers:
            _add(self._journal_totals, event)
        if leftovers:
            log.warning("spend journal: %d events from a previous run; replaying", len(leftovers))
        await self.flush()
        self._task = asyncio.create_task(self._run(), name="ballast-spend-flusher")

    async def close(self) -> None:
        """Flush everything to the database; if it is down, to the journal. Nothing is lost."""
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tick, self._tick_task = self._tick_task, None
        if tick is not None:
            with contextlib.suppress(Exception):
                await tick
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            with contextlib.suppress(Exception):
                await attempt
        await self.flush()
        if self._pending or self._inflight:  # the journal failed too: say so, loudly
            log.error(
                "spend: %d events could be written neither to the database nor to the journal",
                len(self._pending) + len(self._inflight),
            )

    # -- hot path ----------------------------------------------------------------------

    def record(self, event: SpendEvent | SpendRow) -> None:
        """Buffer one event (sync, O(1), never raises)."""
        try:
            self._pending.add(event)
        except Exception:  # pragma: no cover - an encoding and a dict update
            log.exception("spend: could not buffer an event")

    def unflushed(self, key_id: str, period: str) -> float:
        """Spend recorded here but not yet known to be in the database (memory + journal)."""
        kp = (key_id, period)
        return (
            self._pending.totals.get(kp, 0.0)
            + self._inflight.totals.get(kp, 0.0)
            + self._journal_totals.get(kp, 0.0)
        )

    @property
    def pending_events(self) -> int:
        return len(self._pending) + len(self._inflight)

    def status(self) -> dict[str, Any]:
        return {
            "pending": self.pending_events,
            "journal": self.journal.exists() or self.replay_journal.exists(),
            "failures": self.failures,
            "db_attempts": self.db_attempts,
            "spills": self.spills,
        }

    # -- reading -----------------------------------------------------------------------

    async def key_spend(self, key_id: str, period: str) -> float:
        """A key's spend for a period, across instances: the Redis counter (seeded from the
        database when missing) when Redis is usable, else the database sum; plus what this
        instance has not flushed yet."""
        kp = (key_id, period)
        local = self.unflushed(key_id, period)
        if self.store is not None:
            name = counter_name(key_id, period)
            try:
                value = await self.store.call(lambda r: r.get(name))
            except StoreUnavailable:
                return await self._committed_total(kp) + local
            if value is not None:
                return float(value) + local
            committed = await self._committed_total(kp)
            try:
                seeded = await self.store.call(
                    lambda r: r.set(name, repr(committed), nx=True, px=int(self.counter_ttl * 1000))
                )
                if not seeded:  # another instance seeded it first: use theirs
                    value = await self.store.call(lambda r: r.get(name))
                    if value is not None:
                        committed = float(value)
            except StoreUnavailable:
                pass
            return committed + local
        return await self._committed_total(kp) + local

    async def _committed_total(self, kp: _KeyPeriod) -> float:
        """The database total; while the database is known down (or fails now), the last total
        read plus what this instance committed since."""
        if self.failures == 0 or self.clock.monotonic() >= self.retry_at:
            base = self._committed.get(kp, 0.0)
            try:
                async with self.db.connect() as connection:
                    result = await connection.execute(
                        sa.select(spend_totals.c.cost).where(
                            spend_totals.c.key_id == kp[0], spend_totals.c.period == kp[1]
                        )
                    )
                    total = float(result.scalar_one_or_none() or 0.0)
                self._db_sums[kp] = (total, base)
                return total
            except Exception as exc:
                log.warning("spend: database sum failed (%s); using the cached one", _brief(exc))
        cached = self._db_sums.get(kp)
        if cached is None:
            raise SpendUnavailable(f"no spend known for key {kp[0]} ({kp[1]})")
        total, base = cached
        return total + self._committed.get(kp, 0.0) - base

    # -- flushing ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self.clock.sleep(self.flush_interval)
            # Shielded: close() cancels the loop only while it sleeps, never mid-spill.
            self._tick_task = asyncio.ensure_future(self._tick())
            await asyncio.shield(self._tick_task)

    async def _tick(self) -> None:
        try:
            busy = self._attempt is not None and not self._attempt.done()
            if busy or self.clock.monotonic() < self.retry_at:
                # The database is slow or backing off: keep memory bounded and durable.
                await self._spill_pending()
            elif self._pending or self._has_journal():
                self._attempt = asyncio.create_task(self.flush(), name="ballast-spend-flush")
        except Exception:  # never let the flusher die
            log.exception("spend: flusher tick failed")

    async def flush(self) -> None:
        """One attempt now: the journal (if any) and the buffer, in one transaction."""
        async with self._flush_lock:
            self._inflight.absorb(self._pending)
            replay: list[SpendEvent] = []
            if self._has_journal():
                try:
                    async with self._journal_lock:
                        replay = await asyncio.to_thread(self._take_journal)
                except OSError as exc:
                    log.error("spend journal unreadable: %s", exc)
            batch = self._inflight
            if not batch and not replay:
                return
            self.db_attempts += 1
            try:
                added = await self._insert(replay, batch)
            except Exception as exc:
                self._on_failure(exc, len(replay), len(batch))
                await self._spill_inflight()
                return
            # Committed: only now does the batch leave memory and the replay file go.
            self._inflight = EventBuffer()
            if replay:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(self.replay_journal.unlink)
                _subtract_all(self._journal_totals, replay, empty=not self._has_journal())
            if self.failures:
                log.warning("spend: database back after %d failed flushes", self.failures)
            self.failures = 0
            self.retry_at = 0.0
            committed = self._committed
            for kp, cost in added.items():
                committed[kp] = committed.get(kp, 0.0) + cost
            await self._add_to_counters(added)

    async def _insert(
        self, checked: Sequence[SpendEvent], fresh: EventBuffer
    ) -> dict[_KeyPeriod, float]:
        """Write the events, and add the ones actually inserted to their key's totals, in
        one transaction; return what was added to each (key, period).

        Every event goes in as JSON text, thousands to a statement (see `EventBuffer`).
        `checked` (a journal's replay) may well be in the database already: the INSERT
        returns what it added. `fresh` (the buffer) almost never is: on SQLite the row count
        proves none was there, without RETURNING, whose one step per row would hand the
        interpreter lock back and forth with the event loop's thread for every row. If an
        id was there (a retry after a commit whose answer was lost), the transaction is
        rolled back and every event checked. PostgreSQL's driver reports no such count:
        there all are checked, and the database adds up what was inserted."""
        replayed = _buffered(checked)
        if fresh and self.db.is_sqlite:
            try:
                return await self._write([replayed], fresh)
            except _AlreadyThere:
                self.rechecks += 1  # rolled back
        return await self._write([replayed, fresh], EventBuffer())

    async def _write(
        self, checked: Sequence[EventBuffer], fresh: EventBuffer
    ) -> dict[_KeyPeriod, float]:
        sqlite = self.db.is_sqlite
        # The dialect's own insert (for the totals), imported when first used: each process
        # loads one.
        if sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
        deltas: dict[_KeyPeriod, float] = {}
        async with self.db.begin() as connection:
            for buffer in checked:
                for text, _ in buffer.json_arrays():
                    result = await connection.exec_driver_sql(_insert_sql(sqlite, True), (text,))
                    for key_id, period, cost in result.fetchall():
                        deltas[(key_id, period)] = deltas.get((key_id, period), 0.0) + cost
            for text, count in fresh.json_arrays():
                result = await connection.exec_driver_sql(_insert_sql(sqlite, False), (text,))
                if result.rowcount != count:
                    raise _AlreadyThere
            for kp, cost in fresh.totals.items():
                deltas[kp] = deltas.get(kp, 0.0) + cost
            if deltas:
                add_totals = insert(spend_totals)
                add_totals = add_totals.on_conflict_do_update(
                    index_elements=[spend_totals.c.key_id, spend_totals.c.period],
                    set_={"cost": spend_totals.c.cost + add_totals.excluded.cost},
                )
                await connection.execute(
                    add_totals,
                    [{"key_id": k, "period": p, "cost": c} for (k, p), c in deltas.items()],
                )
        return deltas

    def _on_failure(self, exc: BaseException, replayed: int, batch: int) -> None:
        self.failures += 1
        ceiling = min(self.max_backoff, self.flush_interval * 2.0**self.failures)
        delay = ceiling * self._rng.uniform(0.5, 1.0)
        self.retry_at = self.clock.monotonic() + delay
        log.warning(
            "spend flush failed (%s): %d buffered + %d journaled events kept; retry in %.1fs",
            _brief(exc),
            batch,
            replayed,
            delay,
        )

    async def _add_to_counters(self, deltas: Mapping[_KeyPeriod, float]) -> None:
        if self.store is None or not (deltas or self._stale_counters):
            return
        stale = list(self._stale_counters)
        names = [counter_name(k, p) for k, p in deltas]

        async def run(r: Any) -> Any:
            pipe = r.pipeline(transaction=False)
            for name in stale:
                pipe.delete(name)  # lost an increment: let it be seeded again from the DB
            for name, delta in zip(names, deltas.values(), strict=True):
                pipe.eval(_INCR_IF_EXISTS, 1, name, repr(delta))
            return await pipe.execute()

        try:
            await self.store.call(run)
            self._stale_counters.difference_update(stale)
        except StoreUnavailable:
            self._stale_counters.update(names)

    # -- the journal -------------------------------------------------------------------

    def _has_journal(self) -> bool:
        return self.replay_journal.exists() or (
            self.journal.exists() and self.journal.stat().st_size > 0
        )

    async def _spill_pending(self) -> None:
        if not self._pending:
            return
        events, self._pending = self._pending, EventBuffer()
        if not await self._spill(events):
            events.absorb(self._pending)  # kept, ahead of the newer ones
            self._pending = events

    async def _spill_inflight(self) -> None:
        events, self._inflight = self._inflight, EventBuffer()
        if not events:
            return
        if not await self._spill(events):
            events.absorb(self._pending)  # kept, ahead of the newer ones
            self._pending = events

    async def _spill(self, events: EventBuffer) -> bool:
        """Append the events to the journal and fsync; False (events kept) if that fails."""
        try:
            async with self._journal_lock:
                await asyncio.to_thread(self._append, events.events())
        except OSError as exc:
            log.error("spend journal write failed (%s): %d events kept in memory", exc, len(events))
            return False
        totals = self._journal_totals
        for kp, cost in events.totals.items():
            totals[kp] = totals.get(kp, 0.0) + cost
        self.spills += 1
        return True

    def _append(self, events: Iterable[SpendEvent]) -> None:
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        _append_bytes(self.journal, b"".join(orjson.dumps(e.row()) + b"\n" for e in events))

    def _take_journal(self) -> list[SpendEvent]:
        """Freeze the journal for a replay: it becomes the replay file (or is appended to the
        one a failed replay left), and new spills start a fresh journal meanwhile."""
        if self.journal.exists():
            if self.replay_journal.exists():
                _append_bytes(self.replay_journal, self.journal.read_bytes())
                self.journal.unlink()
            else:
                os.replace(self.journal, self.replay_journal)
            _fsync_dir(self.journal.parent)
        if not self.replay_journal.exists():
            return []
        return _read_journal(self.replay_journal)

    def _read_all_journals(self) -> list[SpendEvent]:
        events: list[SpendEvent] = []
        for path in (self.replay_journal, self.journal):
            if path.exists():
                events.extend(_read_journal(path))
        return events


def _read_journal(path: Path) -> list[SpendEvent]:
    events: list[SpendEvent] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(SpendEvent.from_row(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("spend journal %s: skipping a torn line %d", path.name, number)
    return events


def _append_bytes(path: Path, data: bytes) -> None:
    """Append whole lines and fsync."""
    with open(path, "a+b") as f:
        if f.tell() > 0:  # a line torn by a crash must not swallow the next one
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _add(totals: dict[_KeyPeriod, float], event: SpendEvent) -> None:
    kp = (event.key_id, event.period)
    totals[kp] = totals.get(kp, 0.0) + event.cost


def _subtract_all(
    totals: dict[_KeyPeriod, float], events: Iterable[SpendEvent], *, empty: bool
) -> None:
    if empty:  # nothing left in this place: drop float residue too
        totals.clear()
        return
    for event in events:
        kp = (event.key_id, event.period)
        left = totals.get(kp, 0.0) - event.cost
        if abs(left) < 1e-12:
            totals.pop(kp, None)
        else:
            totals[kp] = left


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__

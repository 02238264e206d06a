"""The flush of spend to SQL: every tick, the buffer (and a journal's replay) in one
idempotent transaction that also adds to the per-key totals, backing off while the
database fails, then the inserted costs added to the shared Redis counters.

Why a module of its own: it is the part that talks to the database and Redis, with the
rules that keep spend counted exactly once (ids, what was really inserted, counters born
only from a full sum). `SpendRecorder` inherits it; its attributes are set there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ballast.resilience.backoff import Backoff
from ballast.resilience.clock import Clock
from ballast.state.db import Database
from ballast.state.schema import spend_events, spend_totals
from ballast.state.spend_buffer import _EVENT_COLUMNS, EventBuffer, SpendEvent, _KeyPeriod
from ballast.state.spend_journal import JournalSide, _subtract_all
from ballast.state.spend_wal import remove
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.spend")

COUNTER_PREFIX = "ballast:spend:"

# Add to a counter only when it exists: a counter is born from a full database sum, never
# from one batch's delta (that would undercount a key's whole history until it expires).
_INCR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
end
return false
"""


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
        casts: tuple[str, ...] = ("",) * 5
        casts += ("::int", "::int", "::float8", "::boolean", "::float8", "::boolean")
        casts += ("::int",) * (len(_EVENT_COLUMNS) - len(casts))  # the usage's parts
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


def counter_name(key_id: str, period: str) -> str:
    return f"{COUNTER_PREFIX}{key_id}:{period}"


class FlushSide(JournalSide):
    """`SpendRecorder`'s writes to the database and the Redis counters."""

    db: Database
    store: RedisStore | None
    flush_interval: float
    clock: Clock
    backoff: Backoff
    failures: int
    retry_at: float
    db_attempts: int
    rechecks: int
    commits: int
    _rng: random.Random
    _committed: dict[_KeyPeriod, float]
    _stale_counters: set[str]
    _flush_lock: asyncio.Lock
    _attempt: asyncio.Task[None] | None
    _tick_task: asyncio.Future[None] | None

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
            owned = self._take_segments()
            replay: list[SpendEvent] = []
            if self._has_journal():
                try:
                    async with self._journal_lock:
                        replay = await asyncio.to_thread(self._take_journal)
                except OSError as exc:
                    log.error("spend journal unreadable: %s", exc)
            batch = self._inflight
            if not batch and not replay:
                self._keep_segments(owned)
                return
            self.db_attempts += 1
            try:
                added = await self._insert(replay, batch)
            except Exception as exc:
                self._on_failure(exc, len(replay), len(batch))
                if await self._spill_inflight():
                    remove(owned)
                else:
                    self._keep_segments(owned)
                return
            # Committed: only now does the batch leave memory, its write-ahead segments and
            # the replay file go.
            self._inflight = EventBuffer()
            self.commits += 1
            remove(owned)
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
        delay = self.backoff.delay(self.failures, self._rng)
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


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__

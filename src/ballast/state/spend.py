"""Spend: every response's cost, batched to the database, never lost.

The hot path calls `SpendRecorder.record()` (sync, O(1)); a background task flushes the
buffer every `flush_interval`. The rules, against the known ways gateways lose spend:

- A batch is written in one transaction, idempotent on the event id, and leaves memory only
  once the commit succeeded (or once it is fsync'd to the journal). Nothing is popped before
  the write is known to be durable.
- Every event is also written, as it is recorded, to a write-ahead log segment
  (`spend_wal.py`) that the flush deletes once the events are committed or journaled, so a
  `kill -9` loses nothing; segments of dead processes are replayed at start-up.
- While the database is down, each tick spills the buffer to a local append-only journal
  (JSON lines, fsync'd), so memory stays bounded. Database attempts back off exponentially
  (with jitter) meanwhile.
- On recovery the journal is replayed in the same transaction as the buffer; ids make a
  replay after a partial failure (or a crash between commit and truncate) harmless, and
  only rows actually inserted count towards the shared Redis counters.
- `close()` (SIGTERM) flushes everything to the database, or to the journal if it is down.

With Redis, each commit adds the inserted costs to `ballast:spend:{key_id}:{period}` so all
instances read one spend per key. A counter is only ever created by a seed from the
database sum (SET NX with an expiry); increments never create one, so a counter can never
start from a partial delta, and any drift (a lost increment, a seed racing a commit) ends
when the counter expires and is seeded again. The database is the truth.

The code is in four modules: the event and its buffer (`spend_buffer.py`), the journal
(`spend_journal.py`), the flush to SQL and the counters (`spend_flush.py`), and here the
`SpendRecorder` callers use (start and close, recording, reading a key's spend) with the
price and period helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from ballast.config import ModelPrice
from ballast.resilience.backoff import Backoff
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.db import Database
from ballast.state.schema import spend_totals
from ballast.state.spend_buffer import EventBuffer, SpendEvent, SpendRow, _KeyPeriod
from ballast.state.spend_flush import COUNTER_PREFIX, FlushSide, _brief, counter_name
from ballast.state.spend_journal import _add
from ballast.state.spend_wal import WriteAheadLog, remove
from ballast.state.store import RedisStore, StoreUnavailable
from ballast.stream.usage import Usage

__all__ = [
    "COUNTER_PREFIX",
    "PERIODS",
    "EventBuffer",
    "SpendEvent",
    "SpendRecorder",
    "SpendRow",
    "SpendUnavailable",
    "cost_of",
    "counter_name",
    "new_event_id",
    "period_of",
]

log = logging.getLogger("ballast.spend")

PERIODS = ("total", "day", "month")


class SpendUnavailable(Exception):
    """Neither Redis nor the database can give a key's spend, and none is cached."""


def new_event_id() -> str:
    return uuid.uuid4().hex


class _Prices(Protocol):
    def get(self, model: str) -> ModelPrice | None: ...


def cost_of(prices: Mapping[str, ModelPrice] | _Prices, model: str, usage: Usage) -> float:
    """Dollars for one response; prices are per million tokens. An unpriced model costs 0.
    Prompt tokens read from the upstream's cache (part of the prompt) cost the model's
    `cached_input` price where it has one; those written to it its `cache_write` price (for
    5 minutes) or `cache_write_1h` (for an hour), else the input price. Reasoning is part of
    the completion, priced as output."""
    price = prices.get(model)
    if price is None:
        return 0.0
    prompt, completion, cached, written, long, _ = usage
    dollars = prompt * price.input + completion * price.output
    if cached and price.cached_input is not None:
        dollars -= cached * (price.input - price.cached_input)
    if written:
        short = price.cache_write if price.cache_write is not None else price.input
        hour = price.cache_write_1h if price.cache_write_1h is not None else short
        dollars += (written - long) * (short - price.input) + long * (hour - price.input)
    return dollars / 1_000_000


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


class SpendRecorder(FlushSide):
    def __init__(
        self,
        db: Database,
        store: RedisStore | None,
        journal_path: str,
        flush_interval: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
        max_backoff: float = 30.0,
        *,
        backoff_jitter: float = 0.5,
        counter_ttl: float = 3600.0,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.journal = Path(journal_path)
        self.replay_journal = self.journal.with_name(self.journal.name + ".replay")
        self.flush_interval = flush_interval
        self.clock = clock
        # The n-th failure in a row waits flush_interval x 2^n at most (the jitter keeps at
        # least half of it), never longer than max_backoff.
        self.backoff = Backoff(
            flush_interval, max(max_backoff, flush_interval), jitter=backoff_jitter
        )
        self.counter_ttl = counter_ttl
        self._rng = rng or random.Random()
        # Events only in memory: new ones, and the batch a flush is writing right now.
        self._pending = EventBuffer()
        self._inflight = EventBuffer()
        self.commits = 0  # flushes committed: a reader that spans one reads again
        # Events in the journal files, not yet known to be committed.
        self._journal_totals: dict[_KeyPeriod, float] = {}
        # What this instance committed (inserted rows only), for the cached database sums.
        self._committed: dict[_KeyPeriod, float] = {}
        self._db_sums: dict[_KeyPeriod, tuple[float, float]] = {}
        self._stale_counters: set[str] = set()
        self._flush_lock = asyncio.Lock()
        self._wal = WriteAheadLog(self.journal)
        self._wal_segments: list[Path] = []  # closed segments of events still in memory
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
            adopted = await asyncio.to_thread(self._adopt_wal_leftovers)
            if adopted:
                log.warning("spend: %d events of a process that died; replaying", adopted)
            leftovers = await asyncio.to_thread(self._read_all_journals)
            self._wal.open()
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
        if not (self._pending or self._inflight):
            self._wal.close()
            remove(self._take_segments())
        else:  # the journal failed too: say so, loudly
            log.error(
                "spend: %d events could be written neither to the database nor to the journal",
                len(self._pending) + len(self._inflight),
            )

    # -- hot path ----------------------------------------------------------------------

    def record(self, event: SpendEvent | SpendRow) -> None:
        """Buffer one event (sync, O(1), never raises)."""
        try:
            self._wal.write(self._pending.add(event))  # the kernel holds it from here on
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
        """A key's spend for a period, across instances: the shared total plus what this
        instance has not flushed yet. A flush that commits while the total is read would
        count its batch twice (in the total and in what was unflushed): read again then."""
        for _ in range(3):
            commits = self.commits
            spent = await self._key_spend(key_id, period)
            if self.commits == commits:
                break
        return spent

    async def _key_spend(self, key_id: str, period: str) -> float:
        """The Redis counter (seeded from the database when missing) when Redis is usable,
        else the database sum; plus what this instance has not flushed yet."""
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
        if (
            self.failures == 0
            or self.clock.monotonic() >= self.retry_at
            or kp not in self._db_sums  # nothing to fall back on: ask anyway
        ):
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

"""The spend journal: while the database is down, buffered events are appended to a local
file (JSON lines, fsync'd) so memory stays bounded and a crash loses at most one tick; on
recovery the file is frozen as the replay file and read back for the flush to write.

Why a module of its own: it is the file-system half of "never lost" (appends that survive
a torn line, renames made durable, totals of what the files hold), apart from the database
half in `spend_flush.py`. `SpendRecorder` inherits it; its attributes are set there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import orjson

from ballast.state.spend_buffer import EventBuffer, SpendEvent, _KeyPeriod
from ballast.state.spend_wal import WriteAheadLog, read_segment, remove

log = logging.getLogger("ballast.spend")


class JournalSide:
    """`SpendRecorder`'s journal files and the spills into them."""

    journal: Path
    replay_journal: Path
    spills: int
    _pending: EventBuffer
    _inflight: EventBuffer
    _journal_totals: dict[_KeyPeriod, float]
    _journal_lock: asyncio.Lock
    _wal: WriteAheadLog
    _wal_segments: list[Path]

    def _has_journal(self) -> bool:
        return self.replay_journal.exists() or (
            self.journal.exists() and self.journal.stat().st_size > 0
        )

    async def _spill_pending(self) -> None:
        if not self._pending:
            return
        events, self._pending = self._pending, EventBuffer()
        owned = self._take_segments()
        if not await self._spill(events):
            events.absorb(self._pending)  # kept, ahead of the newer ones
            self._pending = events
            self._keep_segments(owned)
        else:
            remove(owned)

    async def _spill_inflight(self) -> bool:
        """True when the batch is in the journal (or was empty)."""
        events, self._inflight = self._inflight, EventBuffer()
        if not events:
            return True
        if not await self._spill(events):
            events.absorb(self._pending)  # kept, ahead of the newer ones
            self._pending = events
            return False
        return True

    def _take_segments(self) -> list[Path]:
        """The write-ahead segments of every event in memory, now taken by a flush or
        spill (whose success makes them redundant); a new segment takes newer events."""
        rotated = self._wal.rotate()
        if rotated is not None:
            self._wal_segments.append(rotated)
        owned, self._wal_segments = self._wal_segments, []
        return owned

    def _keep_segments(self, owned: list[Path]) -> None:
        """A flush or spill failed: its events are back in memory, so are their segments."""
        self._wal_segments = owned + self._wal_segments

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

    def _adopt_wal_leftovers(self) -> int:
        """Move the events of write-ahead segments that a dead process left into the journal
        (skipping those already there), so the start-up replay writes them; then drop the
        segments. Returns how many events moved."""
        segments = self._wal.leftovers()
        if not segments:
            return 0
        known = {e.id for e in self._read_all_journals()}
        events = []
        for path in segments:
            for event in read_segment(path):
                if event.id not in known:
                    known.add(event.id)
                    events.append(event)
        if events:
            self._append(events)
        remove(segments)
        return len(events)

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

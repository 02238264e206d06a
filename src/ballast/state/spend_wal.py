"""The spend write-ahead log: every spend event is written to a local file as it is recorded,
before the answer it bills completes, so a `kill -9` cannot lose it; the flush deletes a
segment once every event in it is committed to the database (or spilled to the journal).

One `write(2)` per event on a file opened for appending: the kernel holds the bytes from
then on, whatever becomes of the process (a few microseconds an event; see docs/keys.md).
Segments are not fsync'd (that would put a disk flush on the path): a crash of the whole
machine, rather than of the process, loses at most one flush interval, as before.

Why a module of its own: the hot path's one write, apart from the journal (which holds
what the database could not take) and the flush. Each process writes its own segments
(the pid is in the name); any process's leftovers are replayed at start-up, idempotently.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import uuid
from pathlib import Path

import orjson

from ballast.state.spend_buffer import SpendEvent

log = logging.getLogger("ballast.spend")


class WriteAheadLog:
    def __init__(self, journal: Path) -> None:
        self.directory = journal.parent
        self.prefix = journal.name + ".wal."
        self._numbers = itertools.count(1)
        self._token = uuid.uuid4().hex[:8]
        self._fd: int | None = None
        self.path: Path | None = None
        self.written = 0  # events written to the open segment
        self.failed = False  # a write failed: events stay in memory only, say so once

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # The pid says whose it is; the rest tells apart recorders of one process.
        name = f"{self.prefix}{os.getpid()}.{self._token}.{next(self._numbers)}"
        self.path = self.directory / name
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.written = 0

    def write(self, line: bytes) -> None:
        """One event's line (sync; never raises)."""
        fd = self._fd
        if fd is None:
            return
        try:
            os.write(fd, line)
            self.written += 1
        except OSError as exc:
            if not self.failed:
                self.failed = True
                log.error("spend write-ahead log unwritable (%s): a crash would lose spend", exc)

    def rotate(self) -> Path | None:
        """Close the open segment and open a new one; the closed one's path, or
        None when it holds nothing."""
        fd, path, written = self._fd, self.path, self.written
        if fd is None:
            return None
        if written == 0:
            return None  # keep writing to the empty one
        self.open()
        os.close(fd)
        return path

    def close(self) -> None:
        """At a clean shutdown, once everything is committed or journaled."""
        fd, path, self._fd = self._fd, self.path, None
        if fd is not None:
            os.close(fd)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def leftovers(self) -> list[Path]:
        """Segments of processes that are gone (a crash, a replaced worker): their events
        may not be in the database. A live process's segments are its own business."""
        if not self.directory.exists():
            return []
        found = []
        for path in self.directory.iterdir():
            if not path.name.startswith(self.prefix) or path == self.path:
                continue
            pid = path.name[len(self.prefix) :].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
                continue
            found.append(path)
        return sorted(found)


def read_segment(path: Path) -> list[SpendEvent]:
    """A segment's events; a line torn by the crash is skipped."""
    events = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                continue  # torn: its answer never completed
            try:
                events.append(SpendEvent.of_values(orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                log.warning("spend write-ahead log %s: skipping a torn line", path.name)
    return events


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

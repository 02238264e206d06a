"""Rate-limit windows shared by every worker of one machine, without Redis: a small file
each worker maps into memory, one fixed-size slot per key, read and written under an
exclusive `flock` held for a few microseconds. With `--workers N`, RPM 10 is then 10 for
the machine, not 10 per worker.

Why a file and not the supervisor: no round trip, no process in the request's path; the
kernel's lock is the only coordination (two system calls an admission). CLOCK_MONOTONIC is
one clock for the whole machine, so the windows agree.

A slot holds the key's windows (as `_LocalKey`) and its parallel requests per worker
process: a worker that dies holding slots leaves them to be cleared by the next worker
that starts (the supervisor starts a replacement at once), so none leaks for good. A key
that finds no slot (the table is full) is limited in its own process, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.ratelimit_lease import _LocalKey

log = logging.getLogger("ballast.ratelimit")

T = TypeVar("T")

_PIDS = 8  # worker processes with parallel requests of one key at once
# digest, window, rc, rp, tc, tp, then (pid, count) pairs; padded to 128 bytes.
_SLOT = struct.Struct(f"<16s5q{2 * _PIDS}i8x")
_PROBES = 64
_EMPTY = bytes(16)


class SharedWindows:
    def __init__(self, path: Path, slots: int = 4096, clock: Clock = SYSTEM_CLOCK) -> None:
        self.slots = slots
        self._clock = clock  # the system's monotonic clock is the whole machine's
        self.size = slots * _SLOT.size
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self._fd).st_size < self.size:
                os.ftruncate(self._fd, self.size)
        self._map = mmap.mmap(self._fd, self.size)
        self._pid = os.getpid()
        self._full_logged = False
        self._slots: dict[str, tuple[bytes, int]] = {}  # key id -> (digest, slot) last seen
        with self._locked():
            self._clear_dead()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def update(self, key_id: str, change: Callable[[_LocalKey], T]) -> T | None:
        """Run `change` on the key's windows under the lock and store what it left; None
        when the table has no slot for the key. `state.inflight` is the machine's parallel
        count: what `change` adds or takes is this process's."""
        known = self._slots.get(key_id)
        if known is None:
            digest = hashlib.blake2b(
                key_id.encode("utf-8", "surrogatepass"), digest_size=16
            ).digest()
            index = -1
        else:
            digest, index = known
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            data = self._map
            if index < 0 or data[index * _SLOT.size : index * _SLOT.size + 16] != digest:
                found = self._find(digest)
                if found is None:
                    if not self._full_logged:
                        self._full_logged = True
                        log.warning("shared rate-limit table full: some keys limited per worker")
                    return None
                index = found
                if len(self._slots) > 4 * self.slots:
                    self._slots.clear()
                self._slots[key_id] = (digest, index)
            offset = index * _SLOT.size
            fields = list(_SLOT.unpack_from(data, offset))
            state = _LocalKey()
            if fields[0] == digest:
                state.window, state.rc, state.rp, state.tc, state.tp = fields[1:6]
            else:  # a new key, or a stale slot taken over: start empty
                fields = [digest, -2, 0, 0, 0, 0, *([0] * (2 * _PIDS))]
            pairs = fields[6:]
            state.inflight = before = sum(pairs[1::2])
            result = change(state)
            fields[1:6] = state.window, state.rc, state.rp, state.tc, state.tp
            if state.inflight != before:
                _add_count(pairs, self._pid, state.inflight - before)
                fields[6:] = pairs
            _SLOT.pack_into(data, offset, *fields)
            return result
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _find(self, digest: bytes) -> int | None:
        """The key's slot, else the first free or stale one on its probe path."""
        start = int.from_bytes(digest[:8], "little") % self.slots
        free = None
        for step in range(_PROBES):
            index = (start + step) % self.slots
            offset = index * _SLOT.size
            found = bytes(self._map[offset : offset + 16])
            if found == digest:
                return index
            if found == _EMPTY:
                return index if free is None else free
            if free is None and self._reusable(offset):
                free = index
        return free

    def _reusable(self, offset: int) -> bool:
        """A slot no request holds and no window counts any more."""
        fields = _SLOT.unpack_from(self._map, offset)
        if any(fields[7::2]):
            return False
        window = fields[1]
        now = int(self._clock.monotonic() // 60.0)
        return bool(window < now - 1)

    def _clear_dead(self) -> None:
        """Drop the parallel counts of worker processes that are gone."""
        for index in range(self.slots):
            offset = index * _SLOT.size
            if bytes(self._map[offset : offset + 16]) == _EMPTY:
                continue
            fields = list(_SLOT.unpack_from(self._map, offset))
            changed = False
            for i in range(6, 6 + 2 * _PIDS, 2):
                pid = fields[i]
                if pid and fields[i + 1] and pid != self._pid and not _alive(pid):
                    fields[i] = fields[i + 1] = 0
                    changed = True
            if changed:
                _SLOT.pack_into(self._map, offset, *fields)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
            os.close(self._fd)


def _add_count(pairs: list[int], pid: int, delta: int) -> None:
    if not delta:
        return
    for i in range(0, len(pairs), 2):
        if pairs[i] == pid:
            pairs[i + 1] = max(0, pairs[i + 1] + delta)
            return
    if delta < 0:
        return  # not ours to take (cleared as a dead process's meanwhile)
    for i in range(0, len(pairs), 2):
        if pairs[i + 1] == 0:
            pairs[i], pairs[i + 1] = pid, delta
            return
    pairs[-1] += delta  # more processes than pairs: the last one is shared


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

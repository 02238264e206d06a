"""A spend event, and the buffer events wait in until they are written: each kept as one
JSON array in a single growing bytearray, with the cost they add up to per key and period.

Why a module of its own: the hot path touches nothing of spend but this (one append per
answer), while the flush, the journal and the reading side all take their events from it.
It does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import orjson

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
    estimated: bool = False  # Ballast's estimate of a stream cut short, not the upstream's
    # Parts of the prompt and completion above, as the upstream reported them: tokens read
    # from its prompt cache, written to it (all, and of those the hour-long ones), reasoned.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

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
            estimated=bool(row.get("estimated", False)),
            cached_tokens=int(row.get("cached_tokens") or 0),
            cache_write_tokens=int(row.get("cache_write_tokens") or 0),
            cache_write_1h_tokens=int(row.get("cache_write_1h_tokens") or 0),
            reasoning_tokens=int(row.get("reasoning_tokens") or 0),
        )

    @classmethod
    def of_values(cls, values: list[Any]) -> SpendEvent:
        """An event from its values in column order (a line of the buffer or its log; one
        written by an older Ballast lacks the columns added since, which take their
        defaults)."""
        return cls(*values)


_EVENT_COLUMNS = SpendEvent._fields

# A `SpendEvent`'s values as a plain tuple, in column order: what the hot path records
# (about 0.3 us less than making the named tuple, which the encoder would copy anyway).
SpendRow = tuple[
    str, str, str, str, str | None, int, int, float, bool, float, bool, int, int, int, int
]


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

    def add(self, event: SpendEvent | SpendRow) -> bytes:
        """Buffer one event; its line (for the write-ahead log)."""
        row = event if type(event) is tuple else tuple(event)  # the encoder takes no subclass
        try:
            line = orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # a string no database could store (a lone surrogate)
            line = orjson.dumps(_storable(row), option=orjson.OPT_APPEND_NEWLINE)
        self._data += line
        self.count += 1
        kp = (event[1], event[2])  # key_id, period
        self.totals[kp] = self.totals.get(kp, 0.0) + event[7]  # cost
        return line

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
        arrays = self.json_arrays()
        return [SpendEvent.of_values(row) for text, _ in arrays for row in orjson.loads(text)]


def _storable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        v.encode("utf-8", "replace").decode("utf-8") if isinstance(v, str) else v for v in row
    )

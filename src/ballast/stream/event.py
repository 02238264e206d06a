"""One event of a stream, typed: its bytes as relayed and its data, parsed at most once.

Everything that reads a stream (the exchange's state and watchdog, the relay's usage filter,
a continuation's splice, the cache's recorder and assembly, the shape translators) reads the
same StreamEvent, so an event is parsed once however many read it, and one no reader asks
about is never parsed. An event Ballast makes itself (a replayed or spliced one) carries its
payload from the start and is not parsed at all. The event is the upstream's as it came (its
`event:` name and raw bytes kept), so a shape's own events can pass through untranslated."""

from __future__ import annotations

from typing import Any, Final

import orjson

from ballast.upstream.sse import DONE, event_data


class _NotJson:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_JSON"


# The payload of an event whose data is not JSON: `[DONE]`, a comment, a malformed chunk.
NOT_JSON: Final[Any] = _NotJson()
_UNREAD: Final = object()


def parse(data: bytes) -> Any:
    """A stream event's data parsed: its JSON, or NOT_JSON. `[DONE]`, in every chat stream,
    is known before a parse would raise on it. (The exchange parses the usual one-line event
    inline as it types it, the same way: that runs for every event of every stream.)"""
    if len(data) < 16 and data.strip() == b"[DONE]":
        return NOT_JSON
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return NOT_JSON


class StreamEvent:
    """One whole event: `raw` as the client gets it (with its blank-line terminator), its
    `data` (None for a comment or an event without data), `json`, the data parsed on first
    use, and its `event:` name if it has one, read from `raw` when asked (few readers ask)."""

    __slots__ = ("_json", "data", "raw")

    def __init__(self, raw: bytes, data: bytes | None, json: Any = _UNREAD) -> None:
        self.raw = raw
        self.data = data
        self._json = json

    @classmethod
    def of(cls, payload: Any, name: bytes | None = None) -> StreamEvent:
        """An event Ballast makes, its payload known (never parsed back)."""
        data = orjson.dumps(payload)
        head = b"data: " if name is None else b"event: " + name + b"\ndata: "
        return cls(head + data + b"\n\n", data, payload)

    @property
    def name(self) -> bytes | None:
        """The `event:` line's name, when the event opens with one."""
        raw = self.raw
        if not raw.startswith(b"event:"):
            return None
        return raw[6 : raw.find(b"\n")].strip()

    @property
    def json(self) -> Any:
        """The data as JSON, parsed once; NOT_JSON for `[DONE]`, no data or malformed data."""
        found = self._json
        if found is _UNREAD:
            data = self.data
            found = self._json = NOT_JSON if data is None else parse(data)
        return found

    @property
    def done(self) -> bool:
        """The `[DONE]` that ends a chat stream."""
        data = self.data
        return data is not None and len(data) < 16 and data.strip() == b"[DONE]"

    def __repr__(self) -> str:
        return f"<StreamEvent {self.raw[:60]!r}>"


def read(event: bytes) -> StreamEvent:
    """An event as a splitter gives it (without its terminator). The usual one-line
    `data: {...}` event is taken at once; anything else is read line by line."""
    if event.startswith(b"data:") and b"\n" not in event:
        return StreamEvent(event + b"\n\n", event[5:])  # JSON may keep its leading space
    return StreamEvent(event + b"\n\n", event_data(event))


def events_of(data: bytes) -> list[StreamEvent]:
    """Whole relayed events (each ending with a blank line) as typed events."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    return [read(e.strip(b"\n")) for e in data.split(b"\n\n") if e.strip()]


def raw(events: list[StreamEvent]) -> bytes:
    """The events' bytes, as relayed."""
    return b"".join([e.raw for e in events])


def usage_only(event: StreamEvent) -> bool:
    """The final usage chunk (`choices: []` with `usage`), which clients get only on request.
    Only an event that names both is looked at (parsed, if no one has yet)."""
    data = event.data
    if data is None or b'"usage"' not in data or b'"choices"' not in data:
        return False
    payload = event.json
    return type(payload) is dict and payload.get("choices") == [] and "usage" in payload


# What ends a finished chat stream the upstream left without it.
DONE_EVENT: Final = StreamEvent(DONE + b"\n\n", DONE[5:].strip(), json=NOT_JSON)

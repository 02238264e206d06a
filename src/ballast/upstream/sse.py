"""Server-sent events from an upstream, as framing only: a byte stream cut into whole events,
and an event's data lines read out. What the events mean is `ballast.stream`'s."""

from __future__ import annotations

DONE = b"data: [DONE]"


class EventTooLarge(ValueError):
    """An event grew past the splitter's `max_event` bytes without ending."""


# The largest event a stream may send (`upstream.max_event_bytes` by default).
MAX_EVENT_BYTES = 4 * 1024 * 1024


class SseSplitter:
    """Cuts a byte stream into complete events (without their blank-line terminator). An
    unfinished event past `max_event` bytes raises EventTooLarge, and is dropped.

    Linear in the bytes fed: an unfinished event is kept as a list of its pieces, and only
    each new piece is searched for the end of the event (with the one byte before it), so a
    long event arriving in small reads is neither copied nor scanned once per read."""

    __slots__ = ("_cr", "_parts", "_size", "max_event")

    def __init__(self, max_event: int = MAX_EVENT_BYTES) -> None:
        self._parts: list[bytes] = []  # the unfinished event, in pieces
        self._size = 0
        self._cr = False  # the last piece ended in CR, held back: it may begin a CRLF
        self.max_event = max_event

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                data = data[:-1]
                self._cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[bytes] = []
        parts = self._parts
        if parts:
            if data.startswith(b"\n") and parts[-1].endswith(b"\n"):
                first, data = b"".join(parts)[:-1], data[1:]
            else:
                end = data.find(b"\n\n")
                if end < 0:
                    self._keep(data)
                    return events
                first, data = b"".join(parts) + data[:end], data[end + 2 :]
            parts.clear()
            self._size = 0
            if first:
                events.append(first)
        if b"\n\n" not in data:
            self._keep(data)
            return events
        pieces = data.split(b"\n\n")
        self._keep(pieces.pop())
        events.extend(p for p in pieces if p)
        return events

    def _keep(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._size > self.max_event:
            self._parts.clear()
            self._size = 0
            raise EventTooLarge(f"an event larger than {self.max_event} bytes")
        self._parts.append(piece)

    def rest(self) -> bytes:
        """What is left when the stream ends: an event that never got its terminator."""
        rest = b"".join(self._parts).strip()
        self._parts.clear()
        self._size = 0
        self._cr = False
        return rest

    def finish(self) -> list[bytes]:
        """The same as a list: the `Decoder` face of the SSE split."""
        rest = self.rest()
        return [rest] if rest else []


def event_data(event: bytes) -> bytes | None:
    """The data payload of an event, or None for comments and events without data."""
    if event.startswith(b"data:"):
        if b"\n" not in event:
            return event[5:].strip()
        return b"\n".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
    if b"\ndata:" in event:
        return b"\n".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
    return None

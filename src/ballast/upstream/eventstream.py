"""AWS event-stream framing (`application/vnd.amazon.eventstream`), decoded incrementally.

Bedrock's ConverseStream answers with binary frames, not SSE. A frame is a 12-byte prelude
(total length, headers length, prelude CRC32), typed headers, a payload and a CRC32 of all
that came before. The decoder is fed whatever the socket gives, checks both CRCs, and refuses
a frame larger than its bound from the prelude alone, before buffering any of it."""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass

from ballast.upstream.http_common import again

PRELUDE_BYTES = 12
CRC_BYTES = 4
MIN_FRAME_BYTES = PRELUDE_BYTES + CRC_BYTES
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

HeaderValue = bool | int | bytes | str | uuid.UUID

_FIXED = {2: (1, ">b"), 3: (2, ">h"), 4: (4, ">i"), 5: (8, ">q")}  # byte, short, int, long


class EventStreamError(Exception):
    """The byte stream is not valid event-stream framing (bad CRC, bad length, bad header)."""


@dataclass(frozen=True, slots=True)
class Frame:
    headers: dict[str, HeaderValue]
    payload: bytes

    def header(self, name: str) -> str | None:
        """A string header (`:event-type`, `:message-type`...), or None."""
        value = self.headers.get(name)
        return value if isinstance(value, str) else None


class EventStreamDecoder:
    """Cuts a byte stream into checked frames; keeps at most one partial frame buffered."""

    __slots__ = ("_buffer", "_error", "_max_frame", "_need")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame_bytes
        self._need = 0  # total length of the frame being assembled, once its prelude is read
        self._error: EventStreamError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by `data`. A bad frame raises EventStreamError, after the
        good frames before it: those come back first and the next call raises. The stream
        has lost its framing then, so every later call raises too."""
        if self._error is not None:
            raise again(self._error)
        self._buffer += data
        frames: list[Frame] = []
        try:
            self._frames(frames)
        except EventStreamError as error:
            self._error = error
            if not frames:
                raise
        return frames

    def _frames(self, frames: list[Frame]) -> None:
        while True:
            if not self._need:
                if len(self._buffer) < PRELUDE_BYTES:
                    return
                self._need = self._prelude()
            if len(self._buffer) < self._need:
                return
            frame = bytes(self._buffer[: self._need])
            del self._buffer[: self._need]
            self._need = 0
            frames.append(_frame(frame))

    def _prelude(self) -> int:
        prelude = bytes(self._buffer[:PRELUDE_BYTES])
        total, headers_length, crc = struct.unpack(">III", prelude)
        if zlib.crc32(prelude[:8]) != crc:
            raise EventStreamError("event-stream prelude CRC mismatch")
        if total < MIN_FRAME_BYTES or headers_length > total - MIN_FRAME_BYTES:
            raise EventStreamError(f"event-stream frame lengths are inconsistent ({total})")
        if total > self._max_frame:
            raise EventStreamError(
                f"event-stream frame of {total} bytes is over the {self._max_frame}-byte limit"
            )
        return int(total)

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame: not zero when the stream ends mid-frame."""
        return len(self._buffer)


def _frame(frame: bytes) -> Frame:
    (crc,) = struct.unpack_from(">I", frame, len(frame) - CRC_BYTES)
    if zlib.crc32(frame[:-CRC_BYTES]) != crc:
        raise EventStreamError("event-stream message CRC mismatch")
    (headers_length,) = struct.unpack_from(">I", frame, 4)
    headers_end = PRELUDE_BYTES + headers_length
    headers = _headers(frame[PRELUDE_BYTES:headers_end])
    return Frame(headers, frame[headers_end:-CRC_BYTES])


def _headers(data: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(data):
            name_length = data[at]
            name = data[at + 1 : at + 1 + name_length].decode()
            at += 1 + name_length
            kind = data[at]
            at += 1
            value, at = _value(data, at, kind)
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"event-stream header is malformed ({exc})") from None
    return headers


def _value(data: bytes, at: int, kind: int) -> tuple[HeaderValue, int]:
    if kind in (0, 1):  # bool true / false carry no bytes
        return kind == 0, at
    if kind in _FIXED:
        size, fmt = _FIXED[kind]
        return struct.unpack_from(fmt, data, at)[0], at + size
    if kind in (6, 7):  # byte array, string: 2-byte length first
        (length,) = struct.unpack_from(">H", data, at)
        raw = data[at + 2 : at + 2 + length]
        if len(raw) != length:
            raise EventStreamError("event-stream header value is cut short")
        return (raw if kind == 6 else raw.decode()), at + 2 + length
    if kind == 8:  # timestamp: milliseconds since the epoch
        return struct.unpack_from(">q", data, at)[0], at + 8
    if kind == 9:
        raw = data[at : at + 16]
        if len(raw) != 16:
            raise EventStreamError("event-stream uuid header is cut short")
        return uuid.UUID(bytes=raw), at + 16
    raise EventStreamError(f"event-stream header type {kind} is unknown")

"""AWS event-stream decoding: frames fed in any split come out whole and checked; a bad CRC,
a broken length or a frame over the bound is a clear EventStreamError, never a crash or a
large allocation. The test encoder is checked against botocore's own decoder, so the frames
here are the ones AWS sends."""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping

import pytest
from botocore.eventstream import EventStreamBuffer  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.upstream.eventstream import EventStreamDecoder, EventStreamError, HeaderValue

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _header(name: str, value: HeaderValue | tuple[str, int]) -> bytes:
    raw = bytes([len(name)]) + name.encode()
    if isinstance(value, tuple):  # ("timestamp", ms) or ("byte"/"short"/"long", n)
        kind, number = value
        code, fmt = {"byte": (2, ">b"), "short": (3, ">h"), "long": (5, ">q"), "ts": (8, ">q")}[
            kind
        ]
        return raw + bytes([code]) + struct.pack(fmt, number)
    if value is True or value is False:
        return raw + bytes([0 if value else 1])
    if isinstance(value, int):
        return raw + b"\x04" + struct.pack(">i", value)
    if isinstance(value, bytes):
        return raw + b"\x06" + struct.pack(">H", len(value)) + value
    if isinstance(value, uuid.UUID):
        return raw + b"\x09" + value.bytes
    data = str(value).encode()
    return raw + b"\x07" + struct.pack(">H", len(data)) + data


def frame(headers: Mapping[str, HeaderValue | tuple[str, int]], payload: bytes) -> bytes:
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


EVENT = {":event-type": "contentBlockDelta", ":message-type": "event"}


def test_one_frame_decodes_with_its_headers_and_payload() -> None:
    data = frame(EVENT, b'{"delta":{"text":"hi"}}')
    frames = EventStreamDecoder().feed(data)
    assert len(frames) == 1
    assert frames[0].header(":event-type") == "contentBlockDelta"
    assert frames[0].payload == b'{"delta":{"text":"hi"}}'


def test_every_header_type_decodes_as_botocore_reads_it() -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    headers: dict[str, HeaderValue | tuple[str, int]] = {
        "t": True,
        "f": False,
        "b": ("byte", -3),
        "s": ("short", 300),
        "i": 70000,
        "l": ("long", 2**40),
        "bytes": b"\x00\x01",
        "str": "héllo",
        "ts": ("ts", 1_700_000_000_000),
        "u": ident,
    }
    data = frame(headers, b"payload")
    ours = EventStreamDecoder().feed(data)[0]
    reference = EventStreamBuffer()
    reference.add_data(data)
    theirs = next(iter(reference))
    assert ours.payload == theirs.payload == b"payload"
    assert ours.headers["t"] is True and ours.headers["f"] is False
    assert ours.headers["b"] == -3 and ours.headers["s"] == 300 and ours.headers["i"] == 70000
    assert ours.headers["l"] == 2**40 and ours.headers["bytes"] == b"\x00\x01"
    assert ours.headers["str"] == "héllo" and ours.headers["u"] == ident
    assert ours.headers["ts"] == 1_700_000_000_000
    for name in ("t", "f", "b", "s", "i", "l", "bytes", "str"):
        assert ours.headers[name] == theirs.headers[name]


def test_a_frame_over_the_bound_is_refused_from_its_prelude() -> None:
    decoder = EventStreamDecoder(max_frame_bytes=1024)
    prelude = struct.pack(">II", 10 * 1024 * 1024, 0)
    prelude += struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(EventStreamError, match="over the 1024-byte limit"):
        decoder.feed(prelude)  # refused before any of its 10 MiB arrives


def test_a_partial_frame_is_pending_until_it_completes() -> None:
    data = frame(EVENT, b"x" * 100)
    decoder = EventStreamDecoder()
    assert decoder.feed(data[:50]) == []
    assert decoder.pending == 50
    assert len(decoder.feed(data[50:])) == 1
    assert decoder.pending == 0


def test_inconsistent_lengths_are_refused() -> None:
    prelude = struct.pack(">II", 20, 10)  # 10 header bytes cannot fit in a 20-byte frame
    prelude += struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(EventStreamError, match="inconsistent"):
        EventStreamDecoder().feed(prelude + b"\x00" * 8)


def test_an_unknown_header_type_is_refused() -> None:
    head = b"\x01x\x0a"
    total = 12 + len(head) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head
    data = body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(EventStreamError, match="header type 10"):
        EventStreamDecoder().feed(data)


payloads = st.lists(st.binary(max_size=200), min_size=1, max_size=6)


@FAST
@given(payloads, st.data())
def test_any_split_gives_the_same_frames(bodies: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(frame(EVENT, body) for body in bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = EventStreamDecoder()
    got: list[bytes] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        got.extend(f.payload for f in decoder.feed(stream[start:cut]))
        start = cut
    assert got == bodies
    assert decoder.pending == 0


@FAST
@given(st.binary(min_size=1, max_size=200), st.data())
def test_any_flipped_byte_is_an_error_not_a_wrong_frame(body: bytes, data: st.DataObject) -> None:
    good = frame(EVENT, body)
    at = data.draw(st.integers(0, len(good) - 1))
    bit = data.draw(st.integers(0, 7))
    bad = bytearray(good)
    bad[at] ^= 1 << bit
    with pytest.raises(EventStreamError, match="CRC mismatch"):
        EventStreamDecoder().feed(bytes(bad))


@FAST
@given(st.binary(max_size=400))
def test_any_bytes_decode_or_raise_a_clear_error(data: bytes) -> None:
    decoder = EventStreamDecoder(max_frame_bytes=4096)
    try:
        decoder.feed(data)
    except EventStreamError:
        pass


def test_good_frames_before_a_bad_one_come_out_first() -> None:
    good = frame(EVENT, b"first")
    bad = bytearray(frame(EVENT, b"second"))
    bad[-1] ^= 0xFF
    decoder = EventStreamDecoder()
    assert [f.payload for f in decoder.feed(good + bytes(bad))] == [b"first"]
    with pytest.raises(EventStreamError, match="message CRC"):
        decoder.feed(b"")
    with pytest.raises(EventStreamError):
        decoder.feed(good)  # the framing is lost for good

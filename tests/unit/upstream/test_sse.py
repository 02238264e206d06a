"""The SSE splitter's costs: linear in the bytes fed however small the reads, and bounded
by `max_event` for an event that never ends."""

from __future__ import annotations

import time

import pytest

from ballast.upstream.sse import EventTooLarge, SseSplitter


def _one_byte_at_a_time(size: int) -> float:
    """CPU seconds to feed one event of `size` bytes in 1-byte pieces, then its end."""
    event = b"data: " + b"x" * size
    splitter = SseSplitter(max_event=2 * size)
    feed = splitter.feed
    start = time.process_time()
    for i in range(len(event)):
        assert not feed(event[i : i + 1])
    events = feed(b"\n\n")
    took = time.process_time() - start
    assert events == [event]
    return took


def test_a_long_event_in_tiny_reads_costs_linear_time() -> None:
    small = _one_byte_at_a_time(128 * 1024)
    # Quadratic (the buffer copied per read) would cost 64 times as much for 8 times the
    # bytes, and minutes in all; linear costs about 8 times. The bound is generous.
    large = _one_byte_at_a_time(1024 * 1024)
    assert large < 24 * max(small, 0.01), (small, large)


def test_an_event_that_never_ends_is_refused_at_the_limit_and_dropped() -> None:
    splitter = SseSplitter(max_event=4096)
    assert splitter.feed(b"data: {}\n\ndata: ") == [b"data: {}"]
    with pytest.raises(EventTooLarge, match="larger than 4096 bytes"):
        for _ in range(100):
            splitter.feed(b"x" * 100)
    assert splitter.rest() == b""


def test_the_end_of_an_event_split_across_reads_is_found() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: 1\n") == []
    assert splitter.feed(b"\ndata: 2\r") == [b"data: 1"]
    assert splitter.feed(b"\n\r\n") == [b"data: 2"]
    assert splitter.feed(b"data: 3\n\n\n") == [b"data: 3"]
    assert splitter.rest() == b""

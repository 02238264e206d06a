"""A pumped stream (`UpstreamStream.pump`): the events of each chunk are handed on from the
connection's callback as they arrive, and the pump's task wakes only for what ends it: the
stream's last events, a client that stopped reading, a failure, or its clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from ballast.resilience import failures
from ballast.resilience.clock import ManualClock
from ballast.resilience.failures import Failure
from ballast.stream.event import StreamEvent, raw
from ballast.stream.exchange import UpstreamStream, open_stream
from ballast.upstream.client import Upstream, UpstreamRequest
from tests.unit.resilience.test_clock import (
    ROLE,
    SSE_HEAD,
    Handler,
    chunked,
    fails_only_after,
    read_request,
)

CHAT = UpstreamRequest("/chat/completions", b"{}")

DONE = chunked(b"data: [DONE]\n\n")


def event(word: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % word.encode()


def text(word: str) -> bytes:
    return chunked(event(word))


class Feed:
    """An upstream the test writes to, part by part, after the answer's head and role."""

    def __init__(self) -> None:
        self.parts: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(SSE_HEAD + ROLE + text("Hi"))
        await writer.drain()
        while (part := await self.parts.get()) is not None:
            writer.write(part)
            await writer.drain()
        writer.transport.abort()  # None: the connection breaks

    async def send(self, *parts: bytes) -> None:
        for part in parts:
            self.parts.put_nowait(part)
            await asyncio.sleep(0.002)  # each its own read on the gateway's side


class Client:
    """What a pump forwards to: the events it took, and whether it takes more."""

    def __init__(self, room: bool = True) -> None:
        self.room = room
        self.events: list[bytes] = []

    def forward(self, events: list[StreamEvent]) -> bool:
        self.events.extend(e.raw for e in events)
        return self.room


async def opened(
    serve: Callable[[Handler], Awaitable[str]],
    upstreams: Callable[..., Awaitable[Upstream]],
    feed: Feed,
    clock: ManualClock,
) -> UpstreamStream:
    upstream = await upstreams(await serve(feed.handler), clock, inter_chunk=900.0)
    stream, held = await open_stream(upstream, CHAT, clock)
    assert len(held) == 2
    return stream


async def test_events_go_on_from_the_callback_and_the_last_ones_come_back(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    feed = Feed()
    stream = await opened(serve, upstreams, feed, ManualClock())
    client = Client()
    pump = asyncio.ensure_future(stream.pump(client.forward))
    await feed.send(text(" there"), text(" you"), DONE)
    last = await asyncio.wait_for(pump, 2.0)
    stream.close()
    assert raw(last) == b"data: [DONE]\n\n"
    assert len(client.events) == 2 and b" you" in client.events[1]
    assert stream.state.content == "Hi there you"
    assert stream.state.done


async def test_a_full_client_buffer_stops_the_pump_and_the_rest_waits_for_the_next(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    feed = Feed()
    stream = await opened(serve, upstreams, feed, ManualClock())
    client = Client(room=False)
    pump = asyncio.ensure_future(stream.pump(client.forward))
    await feed.send(text(" there"))
    assert await asyncio.wait_for(pump, 2.0) == []  # drain the client, then pump again
    await feed.send(text(" you"), DONE)  # arrives meanwhile: buffered, not lost
    await asyncio.sleep(0.01)
    client.room = True
    rest = await asyncio.wait_for(stream.pump(client.forward), 2.0)
    stream.close()
    assert len(client.events) == 1 and b" there" in client.events[0]
    assert raw(rest).endswith(b"data: [DONE]\n\n")
    assert stream.state.content == "Hi there you"


async def test_a_pumped_stream_gone_silent_fails_once_the_clock_passes_inter_chunk(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    feed = Feed()
    stream = await opened(serve, upstreams, feed, clock)
    pump = asyncio.ensure_future(stream.pump(Client().forward))
    await asyncio.sleep(0.005)
    clock.advance(600.0)
    await feed.send(text(" there"))  # moves the deadline to 600 + 900 without a task
    await asyncio.sleep(0.005)
    clock.advance(600.0)  # 1,200 s since the pump began: past the first deadline
    error = await fails_only_after(clock, pump, 300.0)
    stream.close()
    assert isinstance(error, Failure)
    assert error.kind is failures.INTER_CHUNK_TIMEOUT


async def test_an_error_event_mid_pump_fails_after_the_text_before_it_went_on(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    feed = Feed()
    stream = await opened(serve, upstreams, feed, ManualClock())
    client = Client()
    pump = asyncio.ensure_future(stream.pump(client.forward))
    error_event = b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
    await feed.send(chunked(event("!") + error_event))
    assert await asyncio.wait_for(pump, 2.0) == []  # the text went on; the error waits
    with pytest.raises(Failure) as raised:
        await asyncio.wait_for(stream.pump(client.forward), 2.0)
    stream.close()
    assert len(client.events) == 1 and b'"!"' in client.events[0]
    assert raised.value.kind is failures.SERVER_ERROR
    assert stream.state.content == "Hi!"


async def test_a_connection_broken_mid_pump_is_a_cut_stream(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    feed = Feed()
    stream = await opened(serve, upstreams, feed, ManualClock())
    pump = asyncio.ensure_future(stream.pump(Client().forward))
    await feed.send(text(" there"))
    feed.parts.put_nowait(None)
    with pytest.raises(Failure) as raised:
        await asyncio.wait_for(pump, 2.0)
    stream.close()
    assert raised.value.kind is failures.STREAM_CUT
    assert stream.state.content == "Hi there"


async def test_an_answer_that_ends_inside_its_last_event_hands_that_event_on_then_is_cut(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    # The body ends after a data line whose blank line never came: the state has read it,
    # so the client must get it too (a continuation goes on from what the state says).
    feed = Feed()
    stream = await opened(serve, upstreams, feed, ManualClock())
    await feed.send(chunked(event(" there").rstrip(b"\n")), b"0\r\n\r\n")
    events = await asyncio.wait_for(stream.next_events(), 2.0)
    assert b'" there"' in raw(events)
    with pytest.raises(Failure) as raised:
        await asyncio.wait_for(stream.next_events(), 2.0)
    stream.close()
    assert raised.value.kind is failures.STREAM_CUT
    assert stream.state.content == "Hi there"

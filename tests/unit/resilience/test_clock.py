"""Every timer runs on the injected clock, I/O deadlines included: with a ManualClock a stalled
stream, a full pool, a blackholed connect or a slow answer fails the moment the clock passes
its bound, and not a moment before, with real loopback sockets and no real waiting."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from ballast.cache.flight import SingleFlight
from ballast.resilience import failures
from ballast.resilience.clock import SYSTEM_CLOCK, ManualClock
from ballast.resilience.failures import Failure
from ballast.state.resp import PipelinedRedis
from ballast.stream.event import raw
from ballast.stream.exchange import open_stream
from ballast.upstream.answer import fetch
from ballast.upstream.client import Upstream, UpstreamRequest
from ballast.upstream.http1 import Pool, split_url

CHAT = UpstreamRequest("/chat/completions", b"{}")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


ROLE = chunked(b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n')
TEXT = chunked(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))


def scripted(*parts: bytes, sent: asyncio.Event | None = None) -> Handler:
    """Read one request, write `parts`, then hold the connection open and silent."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for part in parts:
            writer.write(part)
        await writer.drain()
        if sent is not None:
            sent.set()
        await reader.read()  # until the client goes away

    return handler


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A loopback port whose connects hang: a listener that never accepts, its queue full (the
    kernel then drops further SYNs, as a firewall that drops packets would)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    yield port
    for sock in [*fillers, listener]:
        sock.close()


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def until(condition: Callable[[], object]) -> None:
    """Let real I/O happen (loopback: a millisecond or so) until `condition` holds."""
    deadline = time.monotonic() + 2.0
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def fails_only_after(
    clock: ManualClock, task: asyncio.Future[Any], bound: float
) -> BaseException:
    """`task` is still waiting just short of `bound` seconds of clock time, and has failed
    once the clock passes it; its exception."""
    await turns()
    clock.advance(bound - 1.0)
    await turns()
    assert not task.done(), "gave up before its bound"
    clock.advance(2.0)
    done, _ = await asyncio.wait([task], timeout=2.0)  # real time: a bound, never reached
    assert done, "still waiting although the clock passed its bound"
    error = task.exception()
    assert error is not None
    return error


# -- the clock's own timers -----------------------------------------------------------------


async def test_advance_runs_due_timers_in_order_each_at_its_own_time() -> None:
    clock = ManualClock(start=0.0)
    seen: list[tuple[str, float]] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: seen.append((name, clock.monotonic()))

    clock.call_at(30.0, note("c"))
    clock.call_later(10.0, note("a"))
    cancelled = clock.call_at(15.0, note("never"))
    clock.call_at(20.0, lambda: (note("b")(), clock.call_later(5.0, note("armed by b"))))
    cancelled.cancel()
    clock.advance(29.0)
    assert seen == [("a", 10.0), ("b", 20.0), ("armed by b", 25.0)]
    assert clock.monotonic() == 29.0
    assert clock.pending == [30.0]
    clock.advance(1.0)
    assert seen[-1] == ("c", 30.0)
    assert clock.pending == []


async def test_a_timer_already_due_runs_on_the_next_loop_turn_without_an_advance() -> None:
    clock = ManualClock()
    ran = asyncio.Event()
    clock.call_at(clock.monotonic() - 5.0, ran.set)
    assert not ran.is_set()
    await asyncio.wait_for(ran.wait(), 1.0)


async def test_sleepers_wake_on_advance_and_a_cancelled_sleep_leaves_no_timer() -> None:
    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.sleep(60.0))
    await turns()
    clock.advance(59.0)
    await turns()
    assert not sleeper.done()
    clock.advance(1.0)
    await asyncio.wait_for(sleeper, 1.0)
    cancelled = asyncio.ensure_future(clock.sleep(60.0))
    await turns()
    cancelled.cancel()
    await turns()
    assert clock.pending == []


async def test_the_system_clock_arms_timers_on_the_monotonic_timeline() -> None:
    fired = asyncio.get_running_loop().create_future()
    when = time.monotonic() + 0.005
    SYSTEM_CLOCK.call_at(when, lambda: fired.set_result(time.monotonic()))
    assert await asyncio.wait_for(fired, 1.0) >= when
    fired = asyncio.get_running_loop().create_future()
    SYSTEM_CLOCK.call_at(time.monotonic() + 0.003, lambda: fired.set_result(1)).cancel()
    SYSTEM_CLOCK.call_later(0.005, lambda: None if fired.done() else fired.set_result(2))
    assert await asyncio.wait_for(fired, 1.0) == 2


# -- the stream's two clocks ----------------------------------------------------------------


async def test_a_stream_gone_silent_fails_once_the_clock_passes_inter_chunk(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    url = await serve(scripted(SSE_HEAD, ROLE, TEXT))
    upstream = await upstreams(url, clock, inter_chunk=900.0)
    stream, held = await open_stream(upstream, CHAT, clock)
    assert len(held) == 2
    task = asyncio.ensure_future(stream.next_events())
    error = await fails_only_after(clock, task, 900.0)
    stream.close()
    assert isinstance(error, Failure)
    assert error.kind is failures.INTER_CHUNK_TIMEOUT


async def test_a_stream_with_no_first_token_fails_once_the_clock_passes_first_token(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    sent = asyncio.Event()
    url = await serve(scripted(SSE_HEAD, sent=sent))  # the answer's headers, then silence
    upstream = await upstreams(url, clock, first_token=45.0, inter_chunk=900.0)
    task = asyncio.ensure_future(open_stream(upstream, CHAT, clock))
    await until(sent.is_set)
    await asyncio.sleep(0.003)  # the headers cross the loopback
    error = await fails_only_after(clock, task, 45.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.FIRST_TOKEN_TIMEOUT
    assert error.message == "upstream went silent"  # after the answer's headers, not before


async def test_a_whole_answer_fails_once_the_clock_passes_the_request_deadline(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    """The router's request deadline and the exchange's budget are on one timeline."""
    clock = ManualClock()
    partial = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{"
    sent = asyncio.Event()
    url = await serve(scripted(partial, sent=sent))
    upstream = await upstreams(url, clock, answer=600.0)
    deadline = clock.monotonic() + 120.0
    task = asyncio.ensure_future(
        fetch(upstream, UpstreamRequest("/chat/completions", b"{}", until=deadline), clock)
    )
    await until(sent.is_set)
    error = await fails_only_after(clock, task, 120.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.REQUEST_TIMEOUT


async def test_a_whole_answer_fails_once_the_clock_passes_its_answer_budget(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    sent = asyncio.Event()
    url = await serve(scripted(sent=sent))  # reads the request, never answers
    upstream = await upstreams(url, clock, answer=300.0)
    deadline = clock.monotonic() + 3600.0
    task = asyncio.ensure_future(
        fetch(upstream, UpstreamRequest("/chat/completions", b"{}", until=deadline), clock)
    )
    await until(sent.is_set)
    error = await fails_only_after(clock, task, 300.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.REQUEST_TIMEOUT


# -- the pool's timers ----------------------------------------------------------------------


async def test_waiting_for_a_pooled_connection_fails_once_the_clock_passes_pool(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    url = await serve(keep_answering)
    upstream = await upstreams(url, clock, pool_size=1, pool=30.0)
    held = await upstream.post(CHAT)  # the pool's only connection
    task = asyncio.ensure_future(upstream.post(CHAT))
    error = await fails_only_after(clock, task, 30.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.POOL_TIMEOUT
    held.close()


async def test_a_connect_to_a_blackholed_address_fails_once_the_clock_passes_connect(
    blackhole: int, upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    upstream = await upstreams(f"http://127.0.0.1:{blackhole}/v1", clock, connect=20.0)
    task = asyncio.ensure_future(upstream.post(CHAT))
    error = await fails_only_after(clock, task, 20.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.CONNECT
    assert error.message == "no connection within 20s"


async def test_a_control_call_fails_once_the_clock_passes_its_budget(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    clock = ManualClock()
    sent = asyncio.Event()
    url = await serve(scripted(sent=sent))
    upstream = await upstreams(url, clock, first_token=60.0)
    task = asyncio.ensure_future(upstream.call_json("POST", url + "/runs", {"model": "m"}))
    await until(sent.is_set)
    error = await fails_only_after(clock, task, 60.0)
    assert isinstance(error, Failure)
    assert error.kind is failures.REQUEST_TIMEOUT


async def test_a_released_answer_that_never_ends_is_dropped_once_the_clock_passes_drain(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    clock = ManualClock()
    url = await serve(scripted(SSE_HEAD, ROLE))  # the closing chunk never comes
    origin, target = split_url(url + "/chat/completions")
    pool = Pool(4, 60.0, connect_timeout=5.0, pool_timeout=5.0, drain_timeout=30.0, clock=clock)
    request = b"POST " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    response = await pool.request(origin, request, b"")
    assert await response.readany()
    response.release()  # kept for the drain: the rest may still come
    await turns()
    clock.advance(pool.drain_timeout / 2)
    await turns()
    assert pool.size == 1
    clock.advance(pool.drain_timeout)
    await until(lambda: pool.size == 0)
    await pool.close()


async def test_an_idle_connection_is_closed_once_the_clock_passes_keepalive(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    clock = ManualClock()
    url = await serve(keep_answering)
    origin, target = split_url(url + "/models")
    pool = Pool(4, keepalive=60.0, connect_timeout=5.0, pool_timeout=5.0, clock=clock)
    request = b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n\r\n"
    response = await pool.request(origin, request, b"")
    await response.read()
    response.release()
    assert pool.idle == 1
    clock.advance(59.0)
    assert pool.idle == 1
    clock.advance(1.0)
    assert pool.idle == 0 and pool.size == 0
    await pool.close()


# -- Redis's lean connection ----------------------------------------------------------------


async def test_a_redis_connect_to_a_blackholed_address_fails_once_the_clock_passes_it(
    blackhole: int,
) -> None:
    clock = ManualClock()
    redis = PipelinedRedis(f"redis://127.0.0.1:{blackhole}/0", connect_timeout=8.0, clock=clock)
    task = asyncio.ensure_future(redis.execute([("PING",)]))
    error = await fails_only_after(clock, task, 8.0)
    assert isinstance(error, TimeoutError)
    redis.disconnect()


# -- the response cache's single-flight -------------------------------------------------------


async def test_a_cache_waiter_goes_alone_once_the_clock_passes_its_bound() -> None:
    clock = ManualClock()
    flight = SingleFlight(clock)
    assert flight.join("k") is None  # a leader that never answers
    task = asyncio.ensure_future(flight.wait("k", 30.0))
    await turns()
    clock.advance(29.0)
    await turns()
    assert not task.done()
    clock.advance(2.0)
    done, _ = await asyncio.wait([task], timeout=2.0)
    assert done, "still waiting although the clock passed its bound"
    assert task.result() == (None, False)
    flight.finish("k", b"late")  # the leader's flight itself was not cancelled


# -- an in-band error in the same read as the text before it --------------------------------

ONE_READ = chunked(
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n'
    b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
)


async def test_text_before_an_error_event_is_relayed_before_the_error(
    serve: Callable[[Handler], Awaitable[str]], upstreams: Callable[..., Awaitable[Upstream]]
) -> None:
    """The text reaches the client first, then the error: what the stream's state counts
    as sent is what was sent, and a continuation goes on from exactly there."""
    clock = ManualClock()
    url = await serve(scripted(SSE_HEAD, ROLE, ONE_READ))
    upstream = await upstreams(url, clock)
    stream, held = await open_stream(upstream, CHAT, clock)
    relayed = list(held)
    with pytest.raises(Failure) as info:
        while True:
            relayed += await stream.next_events()
    stream.close()
    assert info.value.kind is failures.SERVER_ERROR
    assert raw(relayed).count(b'"content"') == 2
    assert stream.state.content == "Hi there"

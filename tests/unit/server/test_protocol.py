"""The guarded uvicorn protocol times a request's headers on the clock it is configured with:
over a real loopback socket, a client that sends half its headers gets 408 and is
disconnected when a ManualClock passes `header_timeout`, and not before."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from uvicorn.config import Config

from ballast.pipeline.asgi import DisconnectWatch
from ballast.resilience.clock import ManualClock
from ballast.server.protocol import GuardedHttpToolsProtocol
from ballast.types import BODY_WRITER, WRITE_TIMED_OUT, Receive, Scope, Send
from tests.unit.server.listen import listen


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


Served = tuple[ManualClock, int]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    clock = ManualClock()
    protocol = type("Protocol", (GuardedHttpToolsProtocol,), {})
    protocol.configure(60.0, 8192, clock)  # type: ignore[attr-defined]  # on the subclass: the shared class stays as it is
    # Kept alive far longer than the header timeout: a pause between requests is not late.
    config = Config(
        app, lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=600
    )
    server = await listen(protocol, config)
    try:
        yield clock, server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_headers_that_never_end_get_408_when_the_clock_passes_the_timeout(
    served: Served,
) -> None:
    clock, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        await writer.drain()
        await turns()
        clock.advance(59.9)
        with pytest.raises(TimeoutError):  # nothing arrives before the timeout
            await asyncio.wait_for(reader.read(1), 0.02)
        clock.advance(0.2)
        answer = await asyncio.wait_for(reader.read(), 5)  # all of it, up to the close
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b'"code":"request_timeout"' in answer
    finally:
        writer.close()


async def test_a_request_whose_headers_arrive_in_time_is_served(served: Served) -> None:
    clock, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        await writer.drain()
        await turns()
        clock.advance(59.9)
        writer.write(b"\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.readexactly(2) == b"ok"
        clock.advance(100.0)  # between requests of a kept-alive connection: no 408
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()


async def test_a_client_that_stops_reading_is_cut_after_the_write_timeout() -> None:
    """The app streams without end; the client reads nothing. Its writes pause once the
    socket is full, and when they stay paused for `client_write_timeout` on the manual clock
    the connection is aborted: the app sees a disconnect, and the scope says why."""
    clock = ManualClock()
    seen: dict[str, object] = {}

    async def endless(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        piece = b"x" * 65536
        for sent in range(1, 100_000):  # bounded: far more than the socket ever takes
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            seen["sent"] = sent
            if scope.get(WRITE_TIMED_OUT):
                break  # aborted: uvicorn's send returns at once now
        seen["timed_out"] = scope.get(WRITE_TIMED_OUT)

    protocol = type("Protocol", (GuardedHttpToolsProtocol,), {})
    protocol.configure(60.0, 8192, clock, client_write_timeout=30.0)  # type: ignore[attr-defined]
    config = Config(endless, lifespan="off", log_level="warning", access_log=False)
    server = await listen(protocol, config)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, server.sockets[0].getsockname())
        await asyncio.get_running_loop().sock_sendall(sock, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(100):  # until the writes pause: nothing more is sent
            before = seen.get("sent")
            await asyncio.sleep(0.02)
            if before is not None and seen.get("sent") == before:
                break
        assert "timed_out" not in seen
        clock.advance(29.0)
        await turns()
        assert "timed_out" not in seen  # paused, not yet cut
        clock.advance(2.0)
        for _ in range(100):
            if "timed_out" in seen:
                break
            await asyncio.sleep(0.01)
        assert seen["timed_out"] is True
    finally:
        sock.close()
        server.close()


async def test_a_corked_answer_leaves_in_one_write_and_closes_after_it() -> None:
    """A whole answer's head and body in one write (one system call, one segment), also
    when the connection closes after it (uvicorn closes the transport inside `send`)."""
    writes: list[int] = []

    async def corked(scope: Scope, receive: Receive, send: Send) -> None:
        writer = scope[BODY_WRITER]
        transport = writer._cycle().transport
        real = transport.write
        counted: list[bytes] = []

        def counting(data: bytes) -> None:
            counted.append(data)
            real(data)

        transport.write = counting
        writer.cork()
        try:
            await app(scope, receive, send)
        finally:
            writer.uncork()
        writes.append(len(counted))

    config = Config(corked, lifespan="off", log_level="warning", access_log=False)
    server = await listen(GuardedHttpToolsProtocol, config)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        await writer.drain()
        answers = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed
        writer.close()
    finally:
        server.close()
    assert answers.count(b"HTTP/1.1 200 ") == 2 and answers.endswith(b"\r\n\r\nok")
    assert writes == [1, 1]


async def test_a_client_that_leaves_is_told_to_the_app_by_its_connection() -> None:
    """The app waits upstream with a disconnect watch on the request's body writer; the
    client hangs up. The connection's own `connection_lost` cancels the app's task: the
    manual clock never moves, so no timer-started watching task could have."""
    clock = ManualClock()
    seen: dict[str, object] = {}
    waiting = asyncio.Event()

    async def waits(scope: Scope, receive: Receive, send: Send) -> None:
        watch = DisconnectWatch(receive, clock, writer=scope[BODY_WRITER])
        try:
            waiting.set()
            await asyncio.Event().wait()  # an upstream that never answers
        except asyncio.CancelledError:
            seen["fired"] = watch.fired  # as the guard stage does: a client gone, not an error
        finally:
            watch.stop()

    protocol = type("Protocol", (GuardedHttpToolsProtocol,), {})
    protocol.configure(60.0, 8192, clock)  # type: ignore[attr-defined]
    config = Config(waits, lifespan="off", log_level="warning", access_log=False)
    server = await listen(protocol, config)
    try:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        await asyncio.wait_for(waiting.wait(), 5)
        writer.close()
        for _ in range(200):
            if "fired" in seen:
                break
            await asyncio.sleep(0.01)
        assert seen["fired"] is True
        # Nor was a watching task's timer armed (the header timer is a minute out).
        assert not [when for when in clock.pending if when < clock.monotonic() + 1]
    finally:
        server.close()


async def test_an_idle_kept_alive_connection_is_closed_on_the_clock_by_one_timer() -> None:
    """A connection idle for `timeout_keep_alive` is closed when the manual clock passes
    it, not before, and one served request after another does not arm a timer each: the
    connection keeps one for its idle time (and one for its headers)."""
    clock = ManualClock()
    protocol = type("Protocol", (GuardedHttpToolsProtocol,), {})
    protocol.configure(60.0, 8192, clock)  # type: ignore[attr-defined]
    config = Config(app, lifespan="off", log_level="warning", access_log=False)
    config.timeout_keep_alive = 5
    server = await listen(protocol, config)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        for _ in range(20):
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"ok"
            clock.advance(1.0)  # 20 s in all, each pause shorter than the idle timeout
            await turns()
        assert len(clock.pending) <= 2
        clock.advance(3.8)  # idle 4.8 s since the last answer: the timer waits out the rest
        await turns()
        with pytest.raises(TimeoutError):  # still open: nothing arrives, no end of file
            await asyncio.wait_for(reader.read(1), 0.02)
        clock.advance(0.3)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    finally:
        writer.close()
        server.close()

"""The body writer (server/writer.py) writes what uvicorn's own `send` would: a response's
head, and a whole answer with its head in one write, byte for byte the same whatever the
headers, on connections kept alive or closed; headers uvicorn refuses never go out."""

from __future__ import annotations

import asyncio

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ballast.resilience.clock import ManualClock
from ballast.server.protocol import GuardedHttpToolsProtocol
from ballast.types import BODY_WRITER, Handler, Receive, Scope, Send
from tests.unit.server.listen import listen


async def _raw_answer(protocol: type[HttpToolsProtocol], app: Handler, request: bytes) -> bytes:
    """The bytes a server of `protocol` answers `request` with, up to its close."""
    config = Config(app, lifespan="off", log_level="critical", access_log=False, date_header=False)
    server = await listen(protocol, config)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer
    finally:
        server.close()


HEADERS = [
    [(b"Content-Type", b"application/json"), (b"content-length", b"2")],
    [(b"x-request-id", b"r-1"), (b"Connection", b"keep-alive, Close")],
    [(b"x-tab", b"a\tb"), (b"content-length", b"2"), (b"content-length", b"9")],
    [(b"content-length", b"2"), (b"transfer-encoding", b"Chunked")],
    [(b"content-length", b"3")],  # not the body's length
    [(b"content-length", b" 2")],  # read by uvicorn's own `send`
    [],  # no length: uvicorn chunks it
    [(b"bad name", b"x"), (b"content-length", b"2")],  # refused
    [(b"x-split", b"a\r\nx-injected: 1"), (b"content-length", b"2")],
]


@pytest.mark.parametrize("how", ["answer", "start"])
@pytest.mark.parametrize("method", [b"POST", b"HEAD"])
@pytest.mark.parametrize("headers", HEADERS)
async def test_a_head_written_by_the_body_writer_is_what_uvicorn_sends(
    headers: list[tuple[bytes, bytes]], method: bytes, how: str
) -> None:
    """A response through the body writer (`answer`: a whole one, head and body in one
    write, the cycle ended; `start`: its head, the body then through `send`) against the
    same response through uvicorn's own `send`: byte for byte the same, on a kept-alive
    connection whose next request is served too, and on one the client closes; headers
    uvicorn refuses never go out."""

    def app(fast: bool) -> Handler:
        async def respond(scope: Scope, receive: Receive, send: Send) -> None:
            await receive()
            writer = scope.get(BODY_WRITER)
            if fast and writer is not None and how == "answer":
                if writer.answer(200, list(headers), b"ok"):
                    return
            if not (fast and writer is not None and how == "start" and writer.start(200, headers)):
                await send({"type": "http.response.start", "status": 200, "headers": headers})
            if how == "answer":
                await send({"type": "http.response.body", "body": b"ok"})
            else:
                await send({"type": "http.response.body", "body": b"o", "more_body": True})
                await send({"type": "http.response.body", "body": b"k"})

        return respond

    one = method + b" / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    last = method + b" / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    ours = type("Protocol", (GuardedHttpToolsProtocol,), {})
    ours.configure(60.0, 8192, ManualClock())  # type: ignore[attr-defined]
    for request in (last, one + last):
        expected = await _raw_answer(HttpToolsProtocol, app(False), request)
        assert await _raw_answer(ours, app(True), request) == expected
    refused = any(b" " in name or b"\n" in value for name, value in headers)
    assert expected == b"" if refused else expected.startswith(b"HTTP/1.1 200 OK\r\n")

"""The request path's HTTP/1.1 client against scripted loopback servers: framing, keep-alive,
the pool's bound, broken and hostile answers, back-pressure and TLS."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from ballast.upstream import http1, http_common
from ballast.upstream.client import UpstreamRequest
from ballast.upstream.http1 import Origin, Pool, split_url

CHAT = UpstreamRequest("/chat/completions", b"{}")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


class Server:
    """Answers each request with `handler` (which returns False to close the connection)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + (await reader.readexactly(length) if length else b"")
                self.requests.append(request)
                if not await self.handler(reader, writer, request):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed or dropped the connection: this one is done
        finally:
            writer.close()

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ssl_context)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()


def answer(raw: bytes, keep: bool = True) -> Handler:
    async def handler(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[tuple[Server, Origin]]]]:
    servers: list[Server] = []

    async def start(handler: Handler, tls: ssl.SSLContext | None = None) -> tuple[Server, Origin]:
        server = Server(handler)
        port = await server.start(tls)
        servers.append(server)
        scheme = "https" if tls else "http"
        origin, _ = split_url(f"{scheme}://127.0.0.1:{port}/v1")
        return server, origin

    yield start
    for server in servers:
        await server.stop()


def pool(limit: int = 4, pool_timeout: float = 2.0, **kw: object) -> Pool:
    return Pool(limit=limit, keepalive=60.0, connect_timeout=2.0, pool_timeout=pool_timeout, **kw)  # type: ignore[arg-type]


def head(target: bytes = b"/v1/x", body: bytes = b"{}") -> bytes:
    return b"POST " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)


async def test_keep_alive_reuses_one_connection(serve) -> None:
    server, origin = await serve(answer(OK))
    p = pool()
    for _ in range(3):
        response = await p.request(origin, head(), b"{}")
        assert response.status == 200
        assert response.headers.get("Content-Type") == "application/json"
        assert await response.read() == b'{"ok":true}'
        response.release()
    assert server.connections == 1
    assert p.size == 1 and p.idle == 1
    assert server.requests[0].endswith(b"\r\n\r\n{}")
    await p.close()


async def test_chunked_and_close_delimited_bodies(serve) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    _, origin = await serve(answer(chunked))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    assert await response.read() == b"hello world"
    response.release()
    assert p.idle == 1  # a chunked answer keeps the connection

    until_close = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n"
    )
    _, origin2 = await serve(answer(until_close, keep=False))
    response = await p.request(origin2, head(), b"{}")
    assert await response.read() == b"data: 1\n\ndata: 2\n\n"
    assert response.at_eof()
    response.release()
    await asyncio.sleep(0)
    assert p.idle == 1  # the close-delimited one is not reused
    await p.close()


async def test_cut_mid_body_is_disconnected_and_not_reused(serve) -> None:
    _, origin = await serve(
        answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789", keep=False)
    )
    p = pool()
    response = await p.request(origin, head(), b"{}")
    with pytest.raises(http1.Disconnected):
        await response.read()
    response.release()
    assert p.size == 0
    await p.close()


async def test_close_before_answer_and_garbage(serve) -> None:
    _, silent = await serve(answer(b"", keep=False))
    _, garbage = await serve(answer(b"SMTP ready\r\n\r\n", keep=False))
    p = pool()
    with pytest.raises(http1.Disconnected):
        await p.request(silent, head(), b"{}")
    with pytest.raises(http1.BadResponse):
        await p.request(garbage, head(), b"{}")
    assert p.size == 0
    await p.close()


async def test_refused_connection_is_connect_failed() -> None:
    origin, _ = split_url("http://127.0.0.1:9/v1")
    p = pool()
    with pytest.raises(http1.ConnectFailed):
        await p.request(origin, head(), b"{}")
    assert p.size == 0
    await p.close()


async def test_informational_answer_is_skipped(serve) -> None:
    _, origin = await serve(answer(b"HTTP/1.1 100 Continue\r\n\r\n" + OK))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    assert response.status == 200
    assert await response.read() == b'{"ok":true}'
    response.release()
    await p.close()


async def test_gzip_body_is_decoded(serve) -> None:
    packed = gzip.compress(b'{"big":"' + b"x" * 5000 + b'"}')
    raw = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed)
    _, origin = await serve(answer(raw + packed))
    brotli_raw = b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 1\r\n\r\nx"
    _, brotli = await serve(answer(brotli_raw))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    assert await response.read() == b'{"big":"' + b"x" * 5000 + b'"}'
    response.release()
    with pytest.raises(http1.BadResponse, match="unreadable br"):
        await p.request(brotli, head(), b"{}")
    await p.close()


async def test_gzip_bomb_inflates_in_bounded_steps_and_ends_at_its_limit(serve) -> None:
    bomb = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    packed = b"".join([*(bomb.compress(zeros) for _ in range(64)), bomb.flush()])  # 64 MB
    raw = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed)
    _, origin = await serve(answer(raw + packed))
    p = pool(high_water=65536)
    response = await p.request(origin, head(), b"{}")
    await asyncio.sleep(0.2)  # all of it arrived, nobody reads: only high_water is inflated
    assert response._buffered <= 65536
    assert len(response._compressed) <= len(packed)
    whole = await response.read()  # read in steps, it is all there
    assert len(whole) == 64 << 20 and not whole.strip(b"\0")
    del whole
    response.release()
    response = await p.request(origin, head(), b"{}")
    with pytest.raises(http1.TooLarge, match="larger than 1048576 bytes"):
        await response.read(max_size=1 << 20)
    assert response._conn is None and not response._chunks and not response._compressed
    await p.close()


async def test_an_answer_announcing_more_than_max_size_is_refused_before_its_body(serve) -> None:
    # 200 MB announced, a few bytes sent: the refusal cannot wait for the body.
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n{   " % (200 << 20)
    _, origin = await serve(answer(raw))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    assert response.length == 200 << 20
    with pytest.raises(http1.TooLarge, match="announces 209715200 bytes, over 1048576"):
        await asyncio.wait_for(response.read(max_size=1 << 20), 1)
    assert response._conn is None and not response._chunks
    await p.close()


async def test_pool_bound_waits_then_times_out(serve) -> None:
    server, origin = await serve(answer(OK))
    p = pool(limit=1, pool_timeout=0.2)
    held = await p.request(origin, head(), b"{}")
    waiting = asyncio.create_task(p.request(origin, head(), b"{}"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await held.read()
    held.release()  # hands the one connection to the waiter
    second = await asyncio.wait_for(waiting, 1)
    assert await second.read() == b'{"ok":true}'
    assert server.connections == 1
    with pytest.raises(http1.PoolTimeout):  # `second` still holds the only connection
        await p.request(origin, head(), b"{}")
    second.release()
    await p.close()


async def test_a_full_pool_makes_room_from_another_origins_idle(serve) -> None:
    _, one = await serve(answer(OK))
    _, two = await serve(answer(OK))
    p = pool(limit=1, pool_timeout=0.2)
    first = await p.request(one, head(), b"{}")
    await first.read()
    first.release()
    second = await p.request(two, head(), b"{}")
    assert await second.read() == b'{"ok":true}'
    second.release()
    assert p.size == 1
    await p.close()


async def test_cancelled_request_drops_its_connection(serve) -> None:
    async def never(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _q: bytes) -> bool:
        await asyncio.sleep(30)
        return False

    _, origin = await serve(never)
    p = pool(limit=1)
    task = asyncio.create_task(p.request(origin, head(), b"{}"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert p.size == 0  # the slot is free again, and the half-done exchange is gone
    await p.close()


async def test_idle_connection_closed_by_upstream_is_not_reused(serve) -> None:
    server, origin = await serve(answer(OK))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    await response.read()
    response.release()
    for writer in server.writers:
        writer.close()
    await asyncio.sleep(0.05)
    response = await p.request(origin, head(), b"{}")
    assert await response.read() == b'{"ok":true}'
    response.release()
    assert server.connections == 2
    await p.close()


async def test_expired_idle_connection_is_replaced(serve) -> None:
    server, origin = await serve(answer(OK))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    await response.read()
    response.release()
    for conns in p._idle.values():
        for conn in conns:
            conn.idle_since -= 61.0  # older than the keep-alive
    response = await p.request(origin, head(), b"{}")
    await response.read()
    response.release()
    assert server.connections == 2
    assert p.size == 1
    await p.close()


async def test_unread_body_pauses_the_socket(serve) -> None:
    size = 4 * 1024 * 1024
    body = bytes(range(256)) * (size // 256)
    _, origin = await serve(answer(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + body))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    for _ in range(50):
        await asyncio.sleep(0.005)
    assert response._paused
    assert response._buffered < http1.HIGH_WATER + 256 * 1024
    assert await response.read() == body
    response.release()
    await p.close()


async def test_unsolicited_bytes_drop_the_idle_connection(serve) -> None:
    _, origin = await serve(answer(OK + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"))
    p = pool()
    response = await p.request(origin, head(), b"{}")
    await response.read()
    response.release()
    await asyncio.sleep(0.05)
    assert p.size == 0
    await p.close()


def late_end(delay: float) -> Handler:
    """An event stream whose final chunk comes `delay` seconds after its `[DONE]` (as from an
    ASGI server that writes the end of a chunked body on its own)."""

    async def handler(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> bool:
        event = b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(delay)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return handler


async def test_a_stream_released_at_done_keeps_its_connection(serve) -> None:
    server, origin = await serve(late_end(0.05))
    p = pool()
    for _ in range(2):
        response = await p.request(origin, head(), b"{}")
        assert await response.readany() == b"data: [DONE]\n\n"
        assert not response.complete
        response.release()  # the reader is done; the body's end is still on its way
        assert p.idle == 0
        for _ in range(40):
            if p.idle:
                break
            await asyncio.sleep(0.01)
        assert p.idle == 1
    assert server.connections == 1
    await p.close()


async def test_a_released_answer_that_never_ends_is_dropped(serve) -> None:
    _, origin = await serve(late_end(30))
    p = Pool(limit=1, keepalive=60.0, connect_timeout=2.0, pool_timeout=2.0, drain_timeout=0.05)
    response = await p.request(origin, head(), b"{}")
    await response.readany()
    response.release()
    for _ in range(40):
        if p.size == 0:
            break
        await asyncio.sleep(0.01)
    assert p.size == 0 and p.idle == 0
    await p.close()


async def test_endless_header_block_is_cut_off(serve) -> None:
    async def endless(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(10_000):
            writer.write(b"x-filler-%d: %s\r\n" % (i, b"a" * 100))
            await writer.drain()
        return False

    _, origin = await serve(endless)
    p = Pool(limit=1, keepalive=60.0, connect_timeout=2.0, pool_timeout=2.0, max_head=16 * 1024)
    with pytest.raises(http1.BadResponse, match="too large"):
        await p.request(origin, head(), b"{}")
    assert p.size == 0
    await p.close()


async def test_a_header_block_too_large_is_refused_even_when_it_arrives_whole(serve) -> None:
    block = b"".join(b"x-filler-%d: %s\r\n" % (i, b"a" * 100) for i in range(400))  # 44 KB
    raw = b"HTTP/1.1 200 OK\r\n" + block + b"content-length: 2\r\n\r\n{}"
    _, origin = await serve(answer(raw))
    p = Pool(limit=1, keepalive=60.0, connect_timeout=2.0, pool_timeout=2.0, max_head=16 * 1024)
    with pytest.raises(http1.BadResponse, match="too large"):
        await p.request(origin, head(), b"{}")
    assert p.size == 0
    await p.close()


def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError):
        http1.header_lines({"x-a": "1\r\nx-b: 2"})
    with pytest.raises(ValueError):
        http1.header_lines({"x a": "1"})
    assert http1.header_lines({"x-a": "1"}) == b"x-a: 1\r\n"
    with pytest.raises(ValueError):
        split_url("http://127.0.0.1:1/v1 x")
    with pytest.raises(ValueError):
        split_url("ftp://127.0.0.1/")
    origin, target = split_url("https://api.example.com/v1/chat?x=1")
    assert origin.tls and origin.port == 443 and origin.host_header == b"host: api.example.com\r\n"
    assert target == b"/v1/chat?x=1"


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def test_tls(serve, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    _, origin = await serve(answer(OK), tls=server_side)
    trusting = ssl.create_default_context(cafile=str(cert))
    p = pool(ssl_context=trusting)
    response = await p.request(origin, head(), b"{}")
    assert await response.read() == b'{"ok":true}'
    response.release()
    await p.close()
    untrusting = pool(ssl_context=ssl.create_default_context())
    with pytest.raises(http1.ConnectFailed, match="TLS"):
        await untrusting.request(origin, head(), b"{}")
    await untrusting.close()


def test_config_refuses_headers_that_would_break_a_request() -> None:
    from pydantic import ValidationError

    from ballast.config import Deployment

    good = Deployment(id="a", url="http://127.0.0.1:1/v1", headers={"X-Org": "acme"})
    assert good.headers == {"X-Org": "acme"}
    for headers in ({"X-Org": "a\r\nx-admin: 1"}, {"X Org": "a"}, {"": "a"}):
        with pytest.raises(ValidationError):
            Deployment(id="a", url="http://127.0.0.1:1/v1", headers=headers)


async def test_a_full_pool_is_busy_not_failing(serve) -> None:
    """The deployment's bulkhead being full says nothing about its health: the router fails
    over without counting it against the deployment's breaker."""
    from ballast.config import Deployment, Timeouts, UpstreamSettings
    from ballast.resilience import failures
    from ballast.resilience.failures import Failure
    from ballast.upstream.client import Upstream

    _, origin = await serve(answer(OK))
    deployment = Deployment(id="d", url=f"http://127.0.0.1:{origin.port}/v1", pool_size=1)
    upstream = Upstream(deployment, Timeouts(pool=0.1), UpstreamSettings())
    await upstream.start()
    held = await upstream.post(CHAT)
    with pytest.raises(Failure) as caught:
        await upstream.post(CHAT)
    assert caught.value.kind is failures.POOL_TIMEOUT
    assert not caught.value.kind.health_failure
    await held.read()
    held.release()
    again = await upstream.post(CHAT)
    assert again.status == 200
    again.release()
    await upstream.close()


def test_config_accepts_ipv6_literal_urls() -> None:
    from pydantic import ValidationError

    from ballast.config import Deployment

    for url in ("http://[::1]:9000/v1", "https://[2001:db8::1]/v1", "http://[::ffff:10.0.0.1]"):
        assert Deployment(id="a", url=url).url == url
    for url in ("http://[::1/v1", "http://[zz::1]:9000/v1", "http://::1:9000/v1"):
        with pytest.raises(ValidationError):
            Deployment(id="a", url=url)
    origin, target = split_url("http://[::1]:9000/v1/chat")
    assert origin.host == "::1" and origin.port == 9000 and target == b"/v1/chat"
    assert origin.host_header == b"host: [::1]:9000\r\n"


async def test_an_ipv6_loopback_upstream_is_reachable() -> None:
    import socket

    from ballast.config import Deployment, Timeouts, UpstreamSettings
    from ballast.upstream.client import Upstream

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(OK)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "::1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(
        Deployment(id="v6", url=f"http://[::1]:{port}/v1"), Timeouts(), UpstreamSettings()
    )
    await upstream.start()
    response = await upstream.post(CHAT)
    assert response.status == 200 and await response.read() == b'{"ok":true}'
    response.release()
    await upstream.close()
    server.close()
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"host: [::1]:{port}\r\n".encode() in seen[0]


@pytest.mark.parametrize(
    "kind", [http_common.Disconnected, http_common.TooLarge, http_common.ConnectTimeout]
)
def test_a_stored_error_raised_again_is_a_copy_and_the_stored_one_keeps_no_traceback(
    kind: type[http_common.HttpError],
) -> None:
    stored = kind("upstream connection broke mid-answer")
    for _ in range(2):
        with pytest.raises(kind, match="broke mid-answer") as raised:
            raise http_common.again(stored)
        assert raised.value is not stored and raised.value.__traceback__ is not None
    assert stored.__traceback__ is None

"""The keep-alive race: an idle pooled connection the upstream closed just as it was reused
is retried once, inside the pool, on a new connection; nothing else is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.upstream import http1
from ballast.upstream.client import Upstream, UpstreamRequest
from ballast.upstream.http1 import Pool, split_url

CHAT = UpstreamRequest("/chat/completions", b"{}")

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n" + b'{"ok":true}'

# What a connection writes for its n-th request (1-based), and whether it stays open after.
Script = Callable[[int, int], tuple[bytes, bool]]  # (connection index, request number)
DROP = (b"", False)  # close once the request arrived, without a byte of answer
ANSWER = (OK, True)


class ScriptedServer:
    """A loopback upstream whose connections follow `script`; a connection that is not kept
    is closed (reset when `reset`) right after the reply."""

    def __init__(self, script: Script, reset: bool = False) -> None:
        self.script = script
        self.reset = reset
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            for number in range(1, 100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                reply, keep = self.script(index, number)
                if reply:
                    writer.write(reply)
                    await writer.drain()
                if not keep:
                    if self.reset:
                        writer.transport.abort()
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[..., Awaitable[tuple[ScriptedServer, int]]]]:
    servers: list[ScriptedServer] = []

    async def start(script: Script, reset: bool = False) -> tuple[ScriptedServer, int]:
        server = ScriptedServer(script, reset)
        servers.append(server)
        return server, await server.start()

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


def head() -> bytes:
    return b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n"


def make_pool() -> Pool:
    return Pool(limit=4, keepalive=60.0, connect_timeout=2.0, pool_timeout=2.0)


def first_connection_drops_second_request(index: int, number: int) -> tuple[bytes, bool]:
    return DROP if index == 0 and number == 2 else ANSWER


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_reused_connection_dropped_by_the_upstream_is_retried_once(
    scripted: Callable[..., Awaitable[tuple[ScriptedServer, int]]], reset: bool
) -> None:
    server, port = await scripted(first_connection_drops_second_request, reset)
    origin, _ = split_url(f"http://127.0.0.1:{port}/v1")
    pool = make_pool()
    for _ in range(2):
        response = await pool.request(origin, head(), b"{}")
        assert response.status == 200
        assert await response.read() == b'{"ok":true}'
        response.release()
    assert pool.silent_retries == 1
    assert server.connections == 2 and server.requests == 3
    await pool.close()


async def test_a_new_connection_dropped_before_answering_is_not_retried(
    scripted: Callable[..., Awaitable[tuple[ScriptedServer, int]]],
) -> None:
    server, port = await scripted(lambda index, number: DROP)
    origin, _ = split_url(f"http://127.0.0.1:{port}/v1")
    pool = make_pool()
    with pytest.raises(http1.Disconnected):
        await pool.request(origin, head(), b"{}")
    assert pool.silent_retries == 0
    assert server.connections == 1
    await pool.close()


async def second_request_fails(pool: http1.Pool, origin: http1.Origin) -> None:
    """One answered request, then one that fails: the connection it left idle is reused."""
    response = await pool.request(origin, head(), b"{}")
    await response.read()
    response.release()
    with pytest.raises(http1.Disconnected):
        await pool.request(origin, head(), b"{}")


async def test_the_retry_happens_once_and_its_failure_is_reported(
    scripted: Callable[..., Awaitable[tuple[ScriptedServer, int]]],
) -> None:
    def script(index: int, number: int) -> tuple[bytes, bool]:
        return ANSWER if index == 0 and number == 1 else DROP

    server, port = await scripted(script)
    origin, _ = split_url(f"http://127.0.0.1:{port}/v1")
    pool = make_pool()
    await second_request_fails(pool, origin)
    assert pool.silent_retries == 1
    assert server.connections == 2
    await pool.close()


async def test_a_reused_connection_cut_after_answer_bytes_is_not_retried(
    scripted: Callable[..., Awaitable[tuple[ScriptedServer, int]]],
) -> None:
    """Once a byte of the answer came, the upstream has the request: sending it again could
    run it twice, so the failure goes up as it is."""

    def script(index: int, number: int) -> tuple[bytes, bool]:
        return ANSWER if number == 1 else (b"HTTP/1.1 200 OK\r\ncontent-le", False)

    server, port = await scripted(script)
    origin, _ = split_url(f"http://127.0.0.1:{port}/v1")
    pool = make_pool()
    await second_request_fails(pool, origin)
    assert pool.silent_retries == 0
    assert server.connections == 1
    await pool.close()


async def test_the_upstream_layer_never_sees_the_retry(
    scripted: Callable[..., Awaitable[tuple[ScriptedServer, int]]],
) -> None:
    _, port = await scripted(first_connection_drops_second_request)
    deployment = Deployment(id="d", url=f"http://127.0.0.1:{port}/v1")
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    await upstream.start()
    for _ in range(2):
        response = await upstream.post(CHAT)
        assert response.status == 200
        await response.read()
        response.release()
    assert upstream._pool is not None and upstream._pool.silent_retries == 1
    await upstream.close()

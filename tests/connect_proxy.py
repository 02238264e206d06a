"""A small outbound proxy on loopback, for tests: CONNECT tunnels (piped both ways) and plain
http requests in absolute form (forwarded one at a time). It records what it was asked."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


def _header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(_header(head, b"content-length") or 0)
    return head, await reader.readexactly(length) if length else b""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        for _ in range(100_000):
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


class ConnectProxy:
    """`status` other than 200 refuses every CONNECT with it; `credentials` ("user:pass",
    base64 as sent) makes it ask for Basic proxy authentication."""

    def __init__(self, status: int = 200, credentials: str | None = None) -> None:
        self.status = status
        self.credentials = credentials
        self.connects: list[str] = []  # CONNECT targets, host:port
        self.request_lines: list[bytes] = []  # plain http requests, as received
        self.authorizations: list[str | None] = []  # proxy-authorization of each
        self.server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self._writers:  # ends every pipe and forward loop
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)

    def _refusal(self, head: bytes) -> bytes | None:
        authorization = _header(head, b"proxy-authorization")
        self.authorizations.append(authorization)
        if self.credentials is not None and authorization != f"Basic {self.credentials}":
            return b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n"
        if self.status != 200:
            return b"HTTP/1.1 %d Refused\r\ncontent-length: 0\r\n\r\n" % self.status
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        try:
            head, body = await _read_message(reader)
            if head.startswith(b"CONNECT "):
                await self._tunnel(head, reader, writer)
            else:
                await self._forward(head, body, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _tunnel(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = head.split(b" ")[1].decode()
        self.connects.append(target)
        refusal = self._refusal(head)
        if refusal is not None:
            writer.write(refusal)
            await writer.drain()
            return
        host, _, port = target.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        self._writers.append(up_writer)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _forward(
        self,
        head: bytes,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            for _ in range(1000):
                line, _, rest = head.partition(b"\r\n")
                self.request_lines.append(line)
                refusal = self._refusal(head)
                if refusal is not None:
                    writer.write(refusal)
                    await writer.drain()
                    return
                method, url, version = line.split(b" ")
                parts = urlsplit(url.decode())
                if upstream is None:
                    assert parts.hostname is not None and parts.port is not None
                    upstream = await asyncio.open_connection(parts.hostname, parts.port)
                    self._writers.append(upstream[1])
                kept = b"\r\n".join(
                    h for h in rest.split(b"\r\n") if not h.lower().startswith(b"proxy-")
                )
                target = (parts.path or "/").encode()
                upstream[1].write(b"%s %s %s\r\n%s%s" % (method, target, version, kept, body))
                answer_head, answer_body = await _read_message(upstream[0])
                writer.write(answer_head + answer_body)
                await writer.drain()
                head, body = await _read_message(reader)
        finally:
            if upstream is not None:
                upstream[1].close()

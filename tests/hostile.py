"""A hostile upstream on loopback, and a gateway process to measure against it.

The upstream answers any POST by the first part of its path (a deployment's URL is
`http://127.0.0.1:PORT/<mode>/v1`): `huge` sends a 200 MB JSON answer, `bomb` a gzip body
that inflates to 256 MB (`big_bomb`: about 1 MB that inflates to 1 GiB), `endless_sse` an
event stream whose first line never ends (`long_line`: one 300 MB line, sent over 5 s), `cut` a
60 MB answer that breaks off after 48 MB, `junk` a whole 48 MB answer that is not JSON.
Each writes until the gateway drops the connection or its answer ends (bounded: at most
300 MB a request). Every other request (the warm-up `GET /models`) gets a small JSON answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import subprocess
import time
import urllib.request
import zlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.stack import Stack, free_port, serve, wait_for

MB = 1024 * 1024
HUGE = 200 * MB
_PIECE = b" " * MB  # JSON whitespace: a parser would read it all before it fails


@functools.cache
def gzip_bomb(megabytes: int = 256) -> bytes:
    """`megabytes` of zeros, gzip-compressed (256 MB to about 260 KB, 1 GiB to about 1 MB)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MB)
    return b"".join([*(packer.compress(zeros) for _ in range(megabytes)), packer.flush()])


async def _huge(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n{" % HUGE
    )
    for _ in range(HUGE // MB):
        writer.write(_PIECE)
        await writer.drain()


CUT = 48 * MB


async def _cut(writer: asyncio.StreamWriter) -> None:
    """A 60 MB answer (below a 64 MB limit) that breaks off after 48 MB."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n{"
        % (60 * MB)
    )
    for _ in range(CUT // MB):
        writer.write(_PIECE)
        await writer.drain()


async def _junk(writer: asyncio.StreamWriter) -> None:
    """A whole 48 MB answer that is not JSON."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % CUT
    )
    for _ in range(CUT // MB):
        writer.write(b"x" * MB)
        await writer.drain()


async def _bomb(writer: asyncio.StreamWriter, megabytes: int = 256) -> None:
    body = gzip_bomb(megabytes)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    writer.write(body)
    await writer.drain()
    await asyncio.sleep(30)  # hold the connection: the gateway must end it


async def _endless_sse(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    writer.write(b"6\r\ndata: \r\n")
    chunk = b"%x\r\n%s\r\n" % (len(_PIECE), b"x" * MB)
    for _ in range(HUGE // MB):
        writer.write(chunk)
        await writer.drain()


async def _long_line(writer: asyncio.StreamWriter) -> None:
    """An event stream whose one line is 300 MB long, sent over about 5 s."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    writer.write(b"6\r\ndata: \r\n")
    chunk = b"%x\r\n%s\r\n" % (len(_PIECE), b"x" * MB)
    for _ in range(300):
        writer.write(chunk)
        await writer.drain()
        await asyncio.sleep(1 / 60)


MODES: dict[str, Callable[[asyncio.StreamWriter], Awaitable[None]]] = {
    "huge": _huge,
    "bomb": _bomb,
    "big_bomb": functools.partial(_bomb, megabytes=1024),
    "endless_sse": _endless_sse,
    "long_line": _long_line,
    "cut": _cut,
    "junk": _junk,
}


class HostileUpstream:
    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.answered = 0  # hostile answers begun

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                mode = head.split(b" ", 2)[1].split(b"/")[1].decode()
                if head.startswith(b"POST") and mode in MODES:
                    self.answered += 1
                    await MODES[mode](writer)
                    if mode != "junk":  # the one complete answer: the connection may go on
                        return
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b'content-length: 11\r\n\r\n{"data":[]}'
                )
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


def hostile_upstream(stack: Stack) -> HostileUpstream:
    upstream = HostileUpstream()
    stack.thread.run(upstream.start())
    return upstream


def rss(pid: int) -> int:
    """Resident bytes of a process now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def peak(pid: int) -> int:
    """The most resident bytes a process had since its peak was last reset."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def reset_peak(pid: int) -> None:
    """Start a process's peak (`VmHWM`) again from what it holds now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@contextlib.contextmanager
def gateway_process(tmp_path: Path, config: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """`ballast serve` (one worker) on `config`: (pid, port), stopped at the end."""
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    process: subprocess.Popen[bytes] = serve(path, port, workers=1)
    try:
        wait_for(lambda: health(port) is not None, timeout=30)
        yield process.pid, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def health(port: int) -> float | None:
    """How long `/health` took to answer 200 (seconds), or None if it did not."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            response.read()
            return time.monotonic() - start if response.status == 200 else None
    except OSError:
        return None


class Sampler:
    """While running: the gateway's highest RSS and its slowest `/health`, sampled every
    20 ms from a thread of its own."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid = pid
        self.port = port
        self.peak = 0
        self.slowest = 0.0
        self._stop = False

    def run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, rss(self.pid))
            took = health(self.port)
            self.slowest = max(self.slowest, took if took is not None else 99.0)
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop = True

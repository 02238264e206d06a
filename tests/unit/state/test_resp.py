"""The lean Redis connection against a scripted fake server: what it sends, and what it does
with broken bytes, replies nobody asked for, and a server that goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from ballast.state.resp import PipelinedRedis

Answer = Callable[[bytes], bytes | None]  # None: close the connection


class FakeRedis:
    """A unix-socket server that records what it receives and answers each read with
    `answer(data)`, or closes the connection when that is None."""

    def __init__(self, path: Path, answer: Answer) -> None:
        self.path = path
        self.answer = answer
        self.received = b""
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> FakeRedis:
        self._server = await asyncio.start_unix_server(self._handle, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(65536):
                self.received += data
                reply = self.answer(data)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "redis.sock"


def pongs(data: bytes) -> bytes:
    return b"+PONG\r\n" * data.count(b"PING")


async def test_the_setup_authenticates_and_selects_before_the_first_batch(
    socket_path: Path,
) -> None:
    def answer(data: bytes) -> bytes:
        return b"+OK\r\n" * (data.count(b"AUTH") + data.count(b"SELECT")) + pongs(data)

    async with FakeRedis(socket_path, answer) as server:
        pipe = PipelinedRedis(f"unix://user:pw@{socket_path}?db=3", connect_timeout=1.0)
        try:
            assert await pipe.execute([("PING",), ("PING",)]) == [b"PONG", b"PONG"]
        finally:
            await pipe.close()
    assert server.received.startswith(
        b"*3\r\n$4\r\nAUTH\r\n$4\r\nuser\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n"
    )
    assert server.received.endswith(b"*1\r\n$4\r\nPING\r\n" * 2)


@pytest.mark.parametrize(
    "garbage",
    [b"?what\r\n", b"+PONG\r\n+EXTRA\r\n"],
    ids=["not RESP", "a reply nobody asked for"],
)
async def test_bytes_out_of_step_fail_the_batch_and_the_next_one_reconnects(
    socket_path: Path, garbage: bytes
) -> None:
    answers = [garbage, b"+PONG\r\n"]

    def answer(data: bytes) -> bytes:
        return answers.pop(0) if answers else pongs(data)

    async with FakeRedis(socket_path, answer) as server:
        pipe = PipelinedRedis(f"unix://{socket_path}", connect_timeout=1.0)
        try:
            if garbage.startswith(b"+PONG"):  # the batch is answered, then the extra breaks
                assert await pipe.execute([("PING",)]) == [b"PONG"]
                await asyncio.sleep(0.05)
            else:
                with pytest.raises(ConnectionError, match="not RESP"):
                    await pipe.execute([("PING",)])
            assert await asyncio.wait_for(pipe.execute([("PING",)]), 1.0) == [b"PONG"]
            assert server.connections == 2
        finally:
            await pipe.close()


async def test_a_server_that_closes_fails_every_waiting_batch(socket_path: Path) -> None:
    def answer(data: bytes) -> bytes | None:
        return None if b"SHUTDOWN" in data else b""  # GETs wait; SHUTDOWN closes

    async with FakeRedis(socket_path, answer):
        pipe = PipelinedRedis(f"unix://{socket_path}", connect_timeout=1.0)
        try:
            waiting = [asyncio.ensure_future(pipe.execute([("GET", "k")])) for _ in range(3)]
            await asyncio.sleep(0.05)
            waiting.append(asyncio.ensure_future(pipe.execute([("SHUTDOWN",)])))
            for future in waiting:
                with pytest.raises(ConnectionError, match="lost"):
                    await asyncio.wait_for(future, 1.0)
        finally:
            await pipe.close()


async def test_nothing_listening_is_a_connection_error(tmp_path: Path) -> None:
    pipe = PipelinedRedis(f"unix://{tmp_path / 'none.sock'}", connect_timeout=1.0)
    try:
        with pytest.raises(OSError):
            await pipe.execute([("PING",)])
    finally:
        await pipe.close()

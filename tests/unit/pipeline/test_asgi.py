"""The request path's own timers run on the app's clock: with a ManualClock, a body that never
finishes is cut off with 408 when the clock passes `server.body_timeout` (not before, and
not on the event loop's time), the disconnect watch starts when the clock passes its delay,
and the request metrics measure the clock's time. The app is driven through its ASGI
callable (tests/unit/drive.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from ballast.pipeline.asgi import WATCH_AFTER
from ballast.resilience.clock import ManualClock
from tests.unit.drive import Client, settings_tree, started, turns

BODY = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})


class Silent:
    """An upstream that takes a request and never answers; notes when the gateway hangs up."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.dropped = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.asked.set()
        while await reader.read(65536):
            pass
        self.dropped.set()
        writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    upstream = Silent()
    await upstream.start()
    yield upstream
    await upstream.close()


async def test_a_body_that_never_finishes_is_408_when_the_clock_passes_the_body_timeout(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    app = await started(settings_tree(tmp_path, "http://127.0.0.1:9/v1"), clock)
    try:
        client = Client(app, "POST", "/v1/chat/completions", [b'{"model":'], complete=False)
        await turns()
        assert client.received >= 1 and client.sent == []
        clock.advance(29.9)
        await turns()
        assert client.sent == [] and not client.task.done()  # not before its time
        clock.advance(0.2)
        await client.done()
        assert client.status == 408
        assert client.json()["error"]["code"] == "request_timeout"
        assert (b"connection", b"close") in client.sent[0]["headers"]
        # The request's latency is the clock's: the 30 s it was held open.
        timing = app.observer.metrics.stats.timings[("unknown", "none")]
        assert timing.latency_sum == pytest.approx(30.0, abs=0.2)
    finally:
        await app.shutdown()


async def test_the_disconnect_watch_starts_when_the_clock_passes_its_delay(
    tmp_path: Path, silent: Silent
) -> None:
    clock = ManualClock()
    app = await started(settings_tree(tmp_path, silent.url), clock)
    try:
        client = Client(app, "POST", "/v1/chat/completions", [BODY])
        await asyncio.wait_for(silent.asked.wait(), 5)  # the request is upstream, waiting
        await turns()
        assert client.received == 1  # the body; nobody listens for a disconnect yet
        clock.advance(WATCH_AFTER * 0.8)
        await turns()
        assert client.received == 1
        clock.advance(WATCH_AFTER * 0.4)
        await turns()
        assert client.received == 2  # the watch is listening now
        client.leave()
        await client.done()
        # The client left, so the upstream request made for it is dropped at once.
        await asyncio.wait_for(silent.dropped.wait(), 5)
        assert client.sent == []
        assert app.generation.in_flight == 0
    finally:
        await app.shutdown()

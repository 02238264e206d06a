"""SIGTERM while 50 streams are open: every stream completes within the grace period, its
spend is recorded, the process exits 0; a second signal ends the wait at once."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.test_shutdown import MASTER, call, start_gateway
from tests.stack import Stack

STREAMS = 50
TOKENS = 30


async def _stream(
    session: aiohttp.ClientSession, url: str, key: str, first: asyncio.Event, opened: list[int]
) -> str:
    body = {
        "model": "chat",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"authorization": f"Bearer {key}"}
    text = b""
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_any():
            if not text:
                opened.append(1)
                if len(opened) == STREAMS:
                    first.set()
            text += chunk
    return text.decode()


def _streams(url: str, key: str, on_open: Any) -> list[str | BaseException]:
    async def run() -> list[str | BaseException]:
        first = asyncio.Event()
        opened: list[int] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            tasks = [
                asyncio.create_task(_stream(session, url, key, first, opened))
                for _ in range(STREAMS)
            ]
            await asyncio.wait_for(first.wait(), 20)
            on_open()
            return list(await asyncio.gather(*tasks, return_exceptions=True))

    return asyncio.run(run())


def _spend_rows(tmp_path: Path, key_id: str) -> int:
    with sqlite3.connect(tmp_path / "ballast.db") as db:
        row = db.execute("SELECT COUNT(*) FROM spend_events WHERE key_id = ?", (key_id,)).fetchone()
    return int(row[0])


def test_sigterm_lets_fifty_open_streams_finish_then_exits_0(stack: Stack, tmp_path: Path) -> None:
    process, url = start_gateway(stack, tmp_path, ["--grace", "15"])
    try:
        stack.set_behaviour(stack.sims[0], f"ok?tokens={TOKENS}&delay=0.1")  # ~3 s a stream
        status, created = call(url + "/admin/keys", {"name": "streams"}, MASTER)
        assert status == 201
        signalled: list[float] = []

        def terminate() -> None:
            signalled.append(time.monotonic())
            process.send_signal(signal.SIGTERM)

        results = _streams(url, created["key"], terminate)
        code = process.wait(20)
        finished = time.monotonic()
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0
    assert finished - signalled[0] < 15  # within the grace period
    complete = [r for r in results if isinstance(r, str) and r.rstrip().endswith("[DONE]")]
    assert len(complete) == STREAMS, [r for r in results if r not in complete][:3]
    for text in complete:
        assert text.count("tok") == TOKENS
    assert _spend_rows(tmp_path, created["id"]) == STREAMS  # every stream's spend is stored


def test_a_second_sigterm_exits_at_once(stack: Stack, tmp_path: Path) -> None:
    process, url = start_gateway(stack, tmp_path, ["--grace", "60"])
    try:
        stack.set_behaviour(stack.sims[0], "ok?tokens=200&delay=0.1")  # 20 s streams

        def terminate_twice() -> None:
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert process.poll() is None  # still waiting for the streams
            process.send_signal(signal.SIGTERM)

        started = time.monotonic()
        _streams(url, MASTER, terminate_twice)
        process.wait(10)
        assert time.monotonic() - started < 8
    finally:
        if process.poll() is None:
            process.kill()

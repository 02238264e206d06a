"""Fixtures shared by the unit tests: an in-process simulator and an HTTP session to reach
it, a manual clock, a fresh SQLite database, and the loopback fixtures of the upstream
client's tests (a scripted server, and upstreams on a clock the test moves)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.resilience.clock import ManualClock
from ballast.sim.server import SimServer, start_sim
from ballast.state.db import Database
from ballast.upstream.client import Upstream
from tests.conftest import sim_options

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[SimServer]:
    """A simulator on the test's own loop, as its `sim` marker asks (default "ok?tokens=4")."""
    options = {"default": "ok?tokens=4", **sim_options(request)}
    server = await start_sim("127.0.0.1", 0, **options)
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    """A new SQLite database with every table, in the test's own directory."""
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'ballast.db'}")
    await database.upgrade()
    yield database
    await database.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Start a loopback server; returns its base URL."""
    servers: list[asyncio.Server] = []
    writers: list[asyncio.StreamWriter] = []

    async def start(handler: Handler) -> str:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(run, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    yield start
    for writer in writers:
        writer.close()
    for server in servers:
        server.close()


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[Upstream]]]:
    started: list[Upstream] = []

    async def make(url: str, clock: ManualClock, pool_size: int = 4, **timeouts: float) -> Upstream:
        deployment = Deployment(id="d", url=url, pool_size=pool_size)
        upstream = Upstream(deployment, Timeouts(**timeouts), UpstreamSettings(), clock=clock)
        await upstream.start()
        started.append(upstream)
        return upstream

    yield make
    for upstream in started:
        await upstream.close()

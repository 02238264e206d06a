"""RedisStore: a request whose Redis call failed takes its fallbacks at once afterwards, so
it waits out at most one call's timeout however many calls it makes."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator

import pytest

from ballast.config import StateSettings
from ballast.state.store import RedisStore, StoreUnavailable, scope_request


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A server that accepts and never answers: a blackholed Redis."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


def store_for(port: int) -> RedisStore:
    settings = StateSettings(
        redis_url=f"redis://127.0.0.1:{port}/0",
        redis_timeout=0.05,
        redis_breaker={"failure_threshold": 100},
    )
    assert settings.redis_url is not None
    return RedisStore(settings.redis_url, settings)


async def test_a_request_waits_out_one_timeout_then_takes_its_fallbacks(silent_port: int) -> None:
    store = store_for(silent_port)

    async def request() -> None:
        scope_request()
        with pytest.raises(StoreUnavailable):
            await store.call(lambda r: r.get("a"))
        for _ in range(3):  # the same request's further calls: no network, no wait
            with pytest.raises(StoreUnavailable, match="earlier in this request"):
                await store.call(lambda r: r.get("b"))

    async def background() -> None:
        for _ in range(2):  # a background task keeps trying: it holds up no client
            with pytest.raises(StoreUnavailable):
                await store.call(lambda r: r.get("c"))

    try:
        await asyncio.create_task(request(), context=contextvars.Context())
        assert store.calls == 1
        # Another request still tries: the breaker decides for everyone.
        await asyncio.create_task(request(), context=contextvars.Context())
        assert store.calls == 2
        await asyncio.create_task(background(), context=contextvars.Context())
        assert store.calls == 4
    finally:
        await store.close()

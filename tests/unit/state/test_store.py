"""RedisStore: a task whose Redis call failed takes its fallbacks at once afterwards, so one
request waits out at most one call's timeout however many calls it makes."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator

import pytest

from ballast.config import StateSettings
from ballast.resilience.clock import ManualClock
from ballast.state.store import RedisStore, StoreUnavailable


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


def store_for(port: int, clock: ManualClock) -> RedisStore:
    settings = StateSettings(
        redis_url=f"redis://127.0.0.1:{port}/0",
        redis_timeout=0.05,
        redis_give_up_for=1.0,
        redis_breaker={"failure_threshold": 100},
    )
    assert settings.redis_url is not None
    return RedisStore(settings.redis_url, settings, clock)


async def test_a_task_waits_out_one_timeout_then_takes_its_fallbacks(silent_port: int) -> None:
    clock = ManualClock()
    store = store_for(silent_port, clock)
    try:
        with pytest.raises(StoreUnavailable):
            await store.call(lambda r: r.get("a"))
        assert store.calls == 1
        for _ in range(3):  # the same request's further calls: no network, no wait
            with pytest.raises(StoreUnavailable, match="earlier in this task"):
                await store.call(lambda r: r.get("b"))
        assert store.calls == 1

        async def another_request() -> None:
            with pytest.raises(StoreUnavailable):
                await store.call(lambda r: r.get("c"))

        # Another task (a request of its own) still tries: the breaker decides for everyone.
        await asyncio.create_task(another_request(), context=contextvars.Context())
        assert store.calls == 2

        clock.advance(1.0)  # the give-up time has passed: this task tries again
        with pytest.raises(StoreUnavailable):
            await store.call(lambda r: r.get("d"))
        assert store.calls == 3
    finally:
        await store.close()

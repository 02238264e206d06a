"""The attempt loop, driven by a fake exchange: how attempts are spent across a chain."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from ballast.config import parse_settings
from ballast.pipeline.context import RequestContext
from ballast.resilience import failures
from ballast.resilience.clock import ManualClock
from ballast.resilience.failures import Failure
from ballast.routing.attempt import Attempt
from ballast.routing.router import Router

URL = "http://127.0.0.1:9/v1"


def make_router(fallbacks: list[str], **routing: object) -> Router:
    settings = parse_settings(
        {
            "routing": {"backoff_base": 0, **routing},
            "models": [
                {"name": "chat", "deployments": [{"id": "p", "url": URL}], "fallbacks": fallbacks},
                {"name": "backup", "deployments": [{"id": "f", "url": URL}]},
            ],
        }
    )
    return Router(settings, ManualClock(), random.Random(1))


def failing_primary(router: Router, calls: list[str]) -> Callable[[Attempt, str], Awaitable[str]]:
    async def exchange(attempt: Attempt, model: str) -> str:
        calls.append(attempt.id)
        if attempt.id == "p":
            raise Failure(failures.SERVER_ERROR, "upstream answered 500", status=500)
        attempt.succeeded()
        return attempt.id

    return exchange


async def run(
    router: Router, request: RequestContext, exchange: Callable[[Attempt, str], Awaitable[str]]
) -> str:
    group = router.resolve(request.model)
    assert group is not None
    return await router.loop.run(request, group, router.loop.begin(), exchange)


REQUEST = RequestContext("/chat/completions", {"model": "chat"}, b"{}", "chat", False)


async def test_retries_of_the_primary_leave_the_fallback_its_turn() -> None:
    router = make_router(["backup"], max_attempts=3)
    calls: list[str] = []
    assert await run(router, REQUEST, failing_primary(router, calls)) == "f"
    assert calls == ["p", "p", "f"]


async def test_request_fallbacks_also_keep_their_turn() -> None:
    router = make_router([], max_attempts=5)
    calls: list[str] = []
    request = RequestContext(
        "/chat/completions", {"model": "chat"}, b"{}", "chat", False, fallbacks=("backup",)
    )
    assert await run(router, request, failing_primary(router, calls)) == "f"
    assert calls == ["p", "p", "p", "p", "f"]


async def test_the_primary_is_always_tried_once_even_with_one_attempt() -> None:
    router = make_router(["backup"], max_attempts=1)
    calls: list[str] = []
    with pytest.raises(Failure) as info:
        await run(router, REQUEST, failing_primary(router, calls))
    assert calls == ["p"]
    assert info.value.kind is failures.SERVER_ERROR


async def test_without_fallbacks_the_group_gets_every_attempt() -> None:
    router = make_router([], max_attempts=4, breaker={"failure_threshold": 10})
    calls: list[str] = []
    with pytest.raises(Failure):
        await run(router, REQUEST, failing_primary(router, calls))
    assert calls == ["p"] * 4


class _NoBackoffClock(ManualClock):
    """Backoff is not under test here: sleeping returns at once."""

    async def sleep(self, seconds: float) -> None:
        return None


async def test_default_settings_absorb_thirty_percent_random_5xx_under_sustained_load() -> None:
    """20 000 requests at 1 000 per second against two deployments that each fail 30 % of
    calls at random: retries must save at least 99 %, and the breakers must not mistake a
    flaky deployment for a dead one (one opening sends all traffic, and its retries, to the
    other, which then opens too, and every request gets a 503 until they recover)."""
    clock = _NoBackoffClock()
    settings = parse_settings(
        {
            "models": [
                {
                    "name": "chat",
                    "deployments": [{"id": "a", "url": URL}, {"id": "b", "url": URL}],
                }
            ]
        }
    )
    router = Router(settings, clock, random.Random(7))
    faults = random.Random(42)

    async def exchange(attempt: Attempt, model: str) -> str:
        if faults.random() < 0.3:
            raise Failure(failures.SERVER_ERROR, "upstream answered 500", status=500)
        attempt.succeeded()
        return attempt.id

    total, ok = 20_000, 0
    for _ in range(total):
        clock.advance(0.001)
        try:
            await run(router, REQUEST, exchange)
        except Failure:
            continue
        ok += 1
    assert ok / total >= 0.99, ok / total

"""Single-flight: one leader per key, every waiter gets its answer, and waiting is bounded."""

from __future__ import annotations

import asyncio

from ballast.cache.flight import SingleFlight


async def test_one_leader_and_every_waiter_gets_its_answer() -> None:
    flight = SingleFlight()
    leaders = 0

    async def request() -> bytes | None:
        nonlocal leaders
        value, leads = await flight.wait("k", 5.0)
        if leads:
            leaders += 1
            await asyncio.sleep(0.01)
            flight.finish("k", b"answer")
            return b"answer"
        return value

    results = await asyncio.gather(*(request() for _ in range(20)))
    assert leaders == 1 and set(results) == {b"answer"} and len(flight) == 0


async def test_a_failed_leader_hands_the_turn_to_one_waiter() -> None:
    flight = SingleFlight()
    attempts = 0

    async def request(fail: bool) -> bytes | None:
        nonlocal attempts
        value, leads = await flight.wait("k", 5.0)
        if not leads:
            return value
        attempts += 1
        await asyncio.sleep(0.01)
        flight.finish("k", None if fail else b"second")
        return None if fail else b"second"

    results = await asyncio.gather(request(True), *(request(False) for _ in range(5)))
    assert attempts == 2 and results[0] is None and set(results[1:]) == {b"second"}


async def test_waiting_is_bounded() -> None:
    flight = SingleFlight()
    assert await flight.wait("k", 1.0) == (None, True)
    started = asyncio.get_running_loop().time()
    assert await flight.wait("k", 0.05) == (None, False)
    assert asyncio.get_running_loop().time() - started < 1.0

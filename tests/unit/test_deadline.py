"""The stream clocks' deadline behaves as asyncio's timeout: it times out only what runs inside
it, and a cancellation from elsewhere (a client that went away) stays a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ballast.upstream.exchange import _Deadline


async def test_a_wait_past_the_deadline_times_out() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        with _Deadline(loop, loop.time() + 0.01):
            await asyncio.sleep(5)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending


async def test_a_block_that_ends_in_time_leaves_no_timer_behind() -> None:
    loop = asyncio.get_running_loop()
    with _Deadline(loop, loop.time() + 0.02):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # would be cancelled here if the timer had stayed armed


async def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    async def wait() -> None:
        with _Deadline(loop, loop.time() + 5):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

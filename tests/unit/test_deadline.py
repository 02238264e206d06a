"""The stream clocks' deadline behaves as asyncio's timeout: it times out only what runs inside
it, and a cancellation from elsewhere (a client that went away) stays a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ballast.upstream.exchange import _Deadline, _Watchdog


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


# -- a stream's watchdog: one timer for every wait --------------------------------------


async def test_waits_that_each_end_in_time_never_time_out_and_share_one_timer() -> None:
    loop = asyncio.get_running_loop()
    watchdog = _Watchdog(loop)
    handles = set()
    for _ in range(8):  # a chunk every 20 ms against a 50 ms gap: 160 ms in all
        with watchdog.until(loop.time() + 0.05):
            handles.add(id(watchdog._handle))
            await asyncio.sleep(0.02)
    assert len(handles) <= 4  # re-armed only when it fired early, not once per wait
    watchdog.close()


async def test_a_wait_past_its_moved_deadline_times_out() -> None:
    loop = asyncio.get_running_loop()
    watchdog = _Watchdog(loop)
    with watchdog.until(loop.time() + 0.03):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # the timer fires with nobody waiting: nothing happens
    started = loop.time()
    with pytest.raises(TimeoutError):
        with watchdog.until(loop.time() + 0.05):
            await asyncio.sleep(5)
    assert 0.04 <= loop.time() - started < 1.0
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    watchdog.close()


async def test_a_cancellation_from_elsewhere_during_a_watched_wait_stays_one() -> None:
    loop = asyncio.get_running_loop()
    watchdog = _Watchdog(loop)
    entered = asyncio.Event()

    async def wait() -> None:
        with watchdog.until(loop.time() + 5):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(wait())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    watchdog.close()
    assert watchdog._handle is None

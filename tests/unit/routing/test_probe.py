"""The background probe's schedule, on the manual clock: an outage's first stretch is probed
every interval, so its end is seen within one; only a long outage backs off, to the cap."""

from __future__ import annotations

import asyncio
import itertools
import random

from ballast.config import parse_settings
from ballast.resilience.clock import ManualClock
from ballast.routing.router import Router

REFUSED = "http://127.0.0.1:9/v1"  # nothing listens: every probe fails at once


async def probe_times(seconds: float, step: float = 0.25) -> list[float]:
    """When the probes of a deployment that stays down went out, from the outage's start."""
    settings = parse_settings(
        {
            "routing": {
                "breaker": {
                    "probe_interval": 2,
                    "max_probe_interval": 10,
                    "probe_backoff_after": 30,
                }
            },
            "models": [{"name": "m", "deployments": [{"id": "a", "url": REFUSED, "model": "m"}]}],
        }
    )
    clock = ManualClock()
    router = Router(settings, clock, random.Random(1))
    start = clock.monotonic()
    sent: list[float] = []
    router.prober.on_event = lambda kind, _: sent.append(clock.monotonic() - start)
    await router.start()
    try:
        target = router.targets["a"]
        target.breaker.force_open(10_000)
        router.prober.watch(target)
        for _ in range(int(seconds / step)):
            clock.advance(step)
            for _ in range(20):  # the refused connection fails on the event loop's turns
                await asyncio.sleep(0)
            await asyncio.sleep(0.001)
    finally:
        await router.close()
    return sent


async def test_a_short_outage_is_probed_every_interval_and_a_long_one_backs_off() -> None:
    sent = await probe_times(80)
    gaps = [round(b - a) for a, b in itertools.pairwise(sent)]
    early = [gap for at, gap in zip(sent[1:], gaps, strict=True) if at <= 30]
    assert early and all(gap == 2 for gap in early), gaps  # 30 s at the base interval
    assert max(gaps) == 10, gaps  # then doubling, never beyond the cap
    assert gaps == sorted(gaps), gaps
    assert len(sent) <= 80 / 2 + 1  # never more than one probe an interval

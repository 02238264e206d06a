"""Budgets: when the shared ledger cannot be asked, the requests queued behind that grant
take the fallback at once instead of each waiting out a timeout of its own."""

from __future__ import annotations

import asyncio

import pytest

from ballast.resilience.clock import ManualClock
from ballast.state.budget_ledger import LedgerUnavailable
from ballast.state.budgets import Budgets


class SlowDownLedger:
    """A ledger that is unreachable: each grant takes `wait` (a timeout) and fails."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.asked = 0
        self.up = False

    async def grant(
        self, key_id: str, period: str, budget: float, amount: float, grant_id: str, ttl: float
    ) -> float | None:
        self.asked += 1
        if self.up:
            return amount * 4
        await asyncio.sleep(self.wait)
        raise LedgerUnavailable("redis")

    async def settle(self, key_id: str, period: str, grant_id: str, spent: float) -> None:
        return None


async def test_requests_queued_behind_a_failed_grant_fail_at_once() -> None:
    clock = ManualClock()
    ledger = SlowDownLedger(wait=0.01)
    budgets = Budgets(ledger, clock)

    async def reserve() -> None:
        with pytest.raises(LedgerUnavailable):
            await budgets.reserve("k", "m", 100.0, 1.0)

    await asyncio.gather(*(reserve() for _ in range(5)))
    assert ledger.asked == 1  # one waited; the four behind it took the fallback at once

    ledger.up = True
    hold = await budgets.reserve("k", "m", 100.0, 1.0)  # a request arriving later asks again
    assert ledger.asked == 2 and hold.amount == 1.0
    await budgets.close()

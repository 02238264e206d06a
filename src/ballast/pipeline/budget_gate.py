"""Budgets at admission: a request's worst-case cost reserved against every budget it falls
under (the key's, the key's budget for the model, the team's), in the ledger every worker
and instance shares (state/budgets.py); while the ledger cannot be asked, the key's budget
checked against its known spend, asked at most once a second per key."""

from __future__ import annotations

import asyncio
import hashlib
import logging

from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.pipeline.pricing import Pricing
from ballast.resilience.clock import Clock
from ballast.state.budget_ledger import LedgerUnavailable
from ballast.state.budgets import BudgetExceeded, Budgets, Hold
from ballast.state.keys import KeyRecord
from ballast.state.spend import SpendRecorder, period_of
from ballast.state.teams import Team

log = logging.getLogger("ballast.access")


class BudgetGate:
    def __init__(
        self, budgets: Budgets | None, pricing: Pricing, spend: SpendRecorder, clock: Clock
    ) -> None:
        self.budgets = budgets
        self.pricing = pricing
        self.spend = spend
        self.clock = clock
        self._budget_cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._refreshing: dict[tuple[str, str], asyncio.Future[float]] = {}

    def give_back(self, holds: tuple[Hold, ...]) -> None:
        """Reservations of a request that was refused after all, or got no answer."""
        if self.budgets is not None:
            for hold in holds:
                self.budgets.settle(hold, 0.0)

    def reserve_now(self, key: KeyRecord, request: RequestContext) -> tuple[Hold, ...] | None:
        """The usual case without a coroutine: only the key's budget, and room in the grant
        held here. None when `reserve` must be awaited."""
        if self.budgets is None or key.budget is None or key.model_budgets:
            return None
        period = period_of(key.budget_period, self.clock.time())
        hold = self.budgets.reserve_now(key.id, period, self.pricing.worst_case(request))
        return (hold,) if hold is not None else None

    async def reserve(
        self, key: KeyRecord, team: Team | None, request: RequestContext
    ) -> tuple[Hold, ...]:
        """The request's worst-case cost, reserved against every budget it falls under: the
        key's, its budget for this model, its team's (shared by every worker and instance);
        429 `insufficient_quota` when one does not fit."""
        budgets = []
        now = self.clock.time()
        if key.budget is not None:
            budgets.append((key.id, period_of(key.budget_period, now), key.budget, "key"))
        if key.model_budgets:
            for model, budget in key.model_budgets:
                if model == request.model:
                    ledger_id = f"{key.id}:{hashlib.sha256(model.encode()).hexdigest()[:12]}"
                    period = period_of(key.budget_period, now)
                    budgets.append((ledger_id, period, budget, f"key's '{model[:100]}'"))
        if team is not None and team.budget is not None:
            budgets.append((team.id, period_of(team.budget_period, now), team.budget, "team"))
        if not budgets:
            return ()
        if self.budgets is None:
            await self.check_spent(key)
            return ()
        worst = self.pricing.worst_case(request)
        holds: list[Hold] = []
        refusing = ""
        try:
            for ledger_id, period, budget, whose in budgets:
                refusing = whose
                hold = self.budgets.reserve_now(ledger_id, period, worst)
                if hold is None:
                    hold = await self.budgets.reserve(ledger_id, period, budget, worst)
                holds.append(hold)
        except BudgetExceeded:
            self.give_back(tuple(holds))
            raise self._over_budget(refusing, True) from None
        except LedgerUnavailable:
            self.give_back(tuple(holds))
            log.warning("budget ledger unavailable; checking the known spend instead")
            await self.check_spent(key)
            return ()
        except BaseException:
            self.give_back(tuple(holds))
            raise
        return tuple(holds)

    async def check_spent(self, key: KeyRecord) -> None:
        """The key's budget against its known spend (without the ledger; and for a job,
        which has no price to reserve): 429 when it is used up."""
        if key.budget is None:
            return
        spent = self._known_spend(key)
        if spent is None:
            spent = await self._spent(key)
        if spent >= key.budget:
            raise self._over_budget("key", False)

    @staticmethod
    def _over_budget(whose: str, reserved: bool) -> ApiError:
        message = f"This {whose} budget is used up."
        if reserved:
            message = (
                f"This request's worst-case cost does not fit in what is left of this {whose} "
                "budget (lower max_tokens, or wait for requests in flight)."
            )
        return ApiError(429, message, "insufficient_quota", "insufficient_quota")

    def known_spend(self, key: KeyRecord) -> float | None:
        """The key's spend this period as far as known without a query, or None (then the
        figure is asked for in the background, for the next time)."""
        spent = self._known_spend(key)
        if spent is None:
            self._refresh_task((key.id, period_of(key.budget_period, self.clock.time())))
        return spent

    def _known_spend(self, key: KeyRecord) -> float | None:
        """The period's spend when no query is due: the shared figure, asked at most once a
        second per key, plus what this instance has not flushed yet. While the figure is
        being asked, requests use the old one (one query, not one per request)."""
        period = period_of(key.budget_period, self.clock.time())
        cache_key = (key.id, period)
        cached = self._budget_cache.get(cache_key)
        if cached is None:
            return None
        if cached[1] > self.clock.monotonic() or cache_key in self._refreshing:
            return cached[0] + self.spend.unflushed(key.id, period)
        return None

    async def _spent(self, key: KeyRecord) -> float:
        """The period's spend when `_known_spend` has none: the request that finds the
        shared figure old or unknown waits for a fresh one."""
        period = period_of(key.budget_period, self.clock.time())
        refresh = self._refresh_task((key.id, period))
        return await asyncio.shield(refresh) + self.spend.unflushed(key.id, period)

    def _refresh_task(self, cache_key: tuple[str, str]) -> asyncio.Future[float]:
        refresh = self._refreshing.get(cache_key)
        if refresh is None:
            # A task of its own: a request that goes away must not cancel it for the others.
            refresh = asyncio.get_running_loop().create_task(self._refresh(cache_key))
            self._refreshing[cache_key] = refresh
            refresh.add_done_callback(lambda _: self._refreshing.pop(cache_key, None))
        return refresh

    async def _refresh(self, cache_key: tuple[str, str]) -> float:
        """The committed spend of (key, period), cached for a second."""
        key_id, period = cache_key
        unflushed = self.spend.unflushed(key_id, period)  # what key_spend adds on top
        try:
            committed = await self.spend.key_spend(key_id, period) - unflushed
        except Exception:
            log.warning("spend unavailable for a budget check; using the last known figure")
            cached = self._budget_cache.get(cache_key)
            return cached[0] if cached else 0.0
        self._budget_cache[cache_key] = (committed, self.clock.monotonic() + 1.0)
        return committed

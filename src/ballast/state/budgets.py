"""Budgets that hold under concurrency: before a request goes upstream its worst-case cost is
reserved against the key's budget, and after the answer the reservation is settled with the
real cost (the difference is refunded).

Reservations are drawn from grants of the shared ledger (`budget_ledger.py`): a grant of the
ledger is held here and requests reserve from it without I/O while it has room. A grant
stops taking requests once it is full, older than `accept_for`, or idle (no request in
flight for `idle_release`), and is then settled with what its requests really cost. Near
the end of a budget every grant is one request's worst case, so no two instances can both
spend the last of it; far from its end, an instance asks the ledger once per many
requests."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from dataclasses import dataclass, field

from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.state.budget_ledger import Ledger, LedgerUnavailable

log = logging.getLogger("ballast.budgets")


class BudgetExceeded(Exception):
    """The request's worst-case cost does not fit in what is left of the budget."""


@dataclass(slots=True)
class Grant:
    id: str
    key_id: str
    period: str
    granted: float
    until: float  # monotonic: takes no new request after this
    used: float = 0.0  # reserved by requests in flight plus what settled ones cost
    in_flight: int = 0
    open: bool = True
    idle: Timer | None = None  # armed while no request is in flight
    idle_since: float = 0.0  # monotonic: when the last request in flight ended


@dataclass(slots=True)
class Hold:
    """One request's reservation."""

    grant: Grant
    amount: float
    settled: bool = field(default=False)


class Budgets:
    def __init__(
        self,
        ledger: Ledger,
        clock: Clock = SYSTEM_CLOCK,
        accept_for: float = 30.0,
        expire_after: float = 660.0,
        idle_release: float = 1.0,
    ) -> None:
        self.ledger = ledger
        self.clock = clock
        self.accept_for = accept_for
        self.expire_after = expire_after  # a dead instance's grants lapse after this
        self.idle_release = idle_release
        # Grants that could not be asked, per key and period: the requests queued behind one
        # take the fallback at once instead of each waiting out a timeout of its own.
        self._unavailable: dict[tuple[str, str], int] = {}
        self._grants: dict[tuple[str, str], Grant] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._prefix = uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.grants = 0  # ledger grants asked for (status and tests)

    def reserve_now(self, key_id: str, period: str, amount: float) -> Hold | None:
        """A reservation from the grant held here, without I/O; None when it has no room."""
        grant = self._grants.get((key_id, period))
        if (
            grant is None
            or not grant.open
            or grant.used + amount > grant.granted
            or self.clock.monotonic() >= grant.until
        ):
            return None
        grant.used += amount
        grant.in_flight += 1
        return Hold(grant, amount)

    async def reserve(self, key_id: str, period: str, budget: float, amount: float) -> Hold:
        """A reservation of `amount`, asking the ledger for a new grant when needed. Raises
        BudgetExceeded, or LedgerUnavailable when the ledger cannot be asked."""
        hold = self.reserve_now(key_id, period, amount)
        if hold is not None:
            return hold
        slot = (key_id, period)
        lock = self._locks.get(slot)
        if lock is None:
            lock = self._locks[slot] = asyncio.Lock()
        failures = self._unavailable.get(slot, 0)
        async with lock:  # one grant asked at a time per key; the others then use it
            hold = self.reserve_now(key_id, period, amount)
            if hold is not None:
                return hold
            old = self._grants.pop(slot, None)
            if old is not None:
                if old.in_flight == 0:  # settled first: what it gives back may be needed now
                    self._close(old, settle=False)
                    await self._settle(old)
                else:
                    self._close(old)
            if self._unavailable.get(slot, 0) != failures:
                raise LedgerUnavailable("failed for the request ahead of this one")
            grant_id = f"{self._prefix}{next(self._ids):x}"
            self.grants += 1
            try:
                granted = await self.ledger.grant(
                    key_id, period, budget, amount, grant_id, self.expire_after
                )
            except LedgerUnavailable:
                self._unavailable[slot] = failures + 1
                raise
            if granted is None:
                raise BudgetExceeded
            grant = Grant(
                grant_id, key_id, period, granted, self.clock.monotonic() + self.accept_for
            )
            self._grants[slot] = grant
            hold = self.reserve_now(key_id, period, amount)
            assert hold is not None  # the grant is at least `amount`
            return hold

    def settle(self, hold: Hold, cost: float) -> None:
        """The request's real cost (0 when nothing was answered): the rest goes back."""
        if hold.settled:
            return
        hold.settled = True
        grant = hold.grant
        grant.used += max(0.0, cost) - hold.amount
        grant.in_flight -= 1
        if grant.in_flight == 0:
            if not grant.open:
                self._close(grant)  # replaced meanwhile: nothing more will use it
            else:
                # Idle: unless another request comes soon, hand what is left back, so other
                # workers and instances can use it (no budget refused for a reservation
                # nobody holds). Not at once: a busy key would ask the ledger every time.
                # One timer per idle spell, not per request: it looks again when it fires.
                grant.idle_since = self.clock.monotonic()
                if grant.idle is None:
                    grant.idle = self.clock.call_later(self.idle_release, lambda: self._idle(grant))

    def _idle(self, grant: Grant) -> None:
        grant.idle = None
        if grant.in_flight or not grant.open:
            return  # busy again: the request that leaves it idle arms a new timer
        left = grant.idle_since + self.idle_release - self.clock.monotonic()
        if left > 0:  # it was used meanwhile: wait out the rest of this idle spell
            grant.idle = self.clock.call_later(left, lambda: self._idle(grant))
            return
        if self._grants.get((grant.key_id, grant.period)) is grant:
            del self._grants[(grant.key_id, grant.period)]
        self._close(grant)

    def _close(self, grant: Grant, settle: bool = True) -> None:
        grant.open = False
        if grant.idle is not None:
            grant.idle.cancel()
            grant.idle = None
        if settle and grant.in_flight == 0:
            task = asyncio.get_running_loop().create_task(self._settle(grant))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle(self, grant: Grant) -> None:
        try:
            await self.ledger.settle(grant.key_id, grant.period, grant.id, grant.used)
        except LedgerUnavailable:
            log.warning(
                "budget ledger unavailable: a grant of key %s lapses on its own", grant.key_id
            )

    async def close(self) -> None:
        """Settle every grant still held (at shutdown)."""
        for grant in list(self._grants.values()):
            grant.open = False
            if grant.in_flight == 0:
                await self._settle(grant)
        self._grants.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

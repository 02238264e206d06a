"""The actor's run registry: which sampling runs are active, and which were reclaimed.

A run is *idle* while no request is in flight on it; it is reclaimed once it has been idle
for longer than ``idle_timeout`` seconds (measured from its creation or from the end of its
last request, on the injected clock). Reclaim happens lazily, whenever a run is looked up,
and in :meth:`RunRegistry.sweep`, which a periodic task calls. Runs that were reclaimed or
deleted are remembered (a bounded, oldest-first set) so they answer "inactive", not
"unknown".
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from ballast.resilience.clock import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

DEFAULT_REMEMBERED = 100_000


class Ended(Enum):
    """Why a run is no longer active."""

    RECLAIMED = "reclaimed"
    DELETED = "deleted"


@dataclass(slots=True)
class Run:
    run_id: str
    model: str
    session_id: str
    created_at: float
    """Wall-clock seconds (``clock.time()``) at creation."""
    last_active: float
    """Monotonic seconds at creation or at the start/end of the latest request."""
    in_flight: int = 0


class RunRegistry:
    """Active runs keyed by id, with idle reclaim on an injectable clock."""

    def __init__(
        self,
        idle_timeout: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        remembered: int = DEFAULT_REMEMBERED,
    ) -> None:
        if not idle_timeout > 0:
            raise ValueError("idle_timeout must be a positive number of seconds")
        if remembered < 1:
            raise ValueError("remembered must be at least 1")
        self.idle_timeout = float(idle_timeout)
        self.clock = clock
        self._remembered = remembered
        self._runs: dict[str, Run] = {}
        self._ended: OrderedDict[str, Ended] = OrderedDict()
        self.created = 0
        self.reclaimed = 0
        self.deleted = 0

    # -- lifecycle ---------------------------------------------------------------------

    def create(self, model: str, session_id: str) -> Run:
        run_id = "run_" + secrets.token_hex(16)
        run = Run(
            run_id=run_id,
            model=model,
            session_id=session_id,
            created_at=self.clock.time(),
            last_active=self.clock.monotonic(),
        )
        self._runs[run_id] = run
        self.created += 1
        logger.info("run %s created (model %r)", run_id, model)
        return run

    def get(self, run_id: str) -> Run | Ended | None:
        """The active run, why it ended (it was reclaimed now if idle too long), or None."""
        run = self._runs.get(run_id)
        if run is None:
            return self._ended.get(run_id)
        if self._idle_too_long(run, self.clock.monotonic()):
            self._end(run, Ended.RECLAIMED)
            return Ended.RECLAIMED
        return run

    def begin(self, run: Run) -> None:
        """A request on ``run`` starts: the run cannot be reclaimed until :meth:`finish`."""
        run.in_flight += 1
        run.last_active = self.clock.monotonic()

    def finish(self, run: Run) -> None:
        """A request on ``run`` ended (in any way): its idle time starts again from now."""
        run.in_flight = max(0, run.in_flight - 1)
        run.last_active = self.clock.monotonic()

    def delete(self, run_id: str) -> bool:
        """End an active run; False if there is none (unknown, reclaimed or deleted)."""
        run = self.get(run_id)
        if not isinstance(run, Run):
            return False
        self._end(run, Ended.DELETED)
        return True

    def sweep(self) -> int:
        """Reclaim every run idle for longer than the timeout; return how many."""
        now = self.clock.monotonic()
        idle = [run for run in self._runs.values() if self._idle_too_long(run, now)]
        for run in idle:
            self._end(run, Ended.RECLAIMED)
        return len(idle)

    # -- reading -----------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._runs)

    def stats(self) -> dict[str, int]:
        return {
            "created": self.created,
            "reclaimed": self.reclaimed,
            "deleted": self.deleted,
            "active": self.active,
        }

    # -- internals ---------------------------------------------------------------------

    def _idle_too_long(self, run: Run, now: float) -> bool:
        return run.in_flight == 0 and now - run.last_active > self.idle_timeout

    def _end(self, run: Run, why: Ended) -> None:
        del self._runs[run.run_id]
        self._ended[run.run_id] = why
        while len(self._ended) > self._remembered:
            self._ended.popitem(last=False)
        if why is Ended.RECLAIMED:
            self.reclaimed += 1
            logger.info("run %s reclaimed after %.0f s idle", run.run_id, self.idle_timeout)
        else:
            self.deleted += 1
            logger.info("run %s deleted", run.run_id)

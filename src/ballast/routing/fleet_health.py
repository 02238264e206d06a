"""The fleet's verdicts on this worker's deployments, and this worker's on the fleet's.

What goes out: a failed attempt while the breaker is closed, a breaker that opened (how long
for, and the Retry-After cooldown among it), a breaker that closed again, an operator's
drain. What comes in can only make this worker more careful, and ends by itself:

- a failure elsewhere counts toward this breaker's threshold (a success here resets it), so
  a dead deployment costs the fleet about `failure_threshold` failures, not that many per
  worker;
- a breaker opened elsewhere opens this one for as long, plus `hold`; while background
  probes (one at a time in the fleet, by their lease) find the deployment still down, every
  breaker is held open past the next probe, so the way back is that one probe and not a live
  request on every worker whose open time ran out; should the probes stop (the prober's
  process died, Redis went away) the holds run out and each worker goes by itself again;
- a cooldown elsewhere is a cooldown here;
- a breaker closed elsewhere (a probe or a live request found the deployment answering)
  closes this one: the one verdict that loosens, and it is an answer, not a guess.

Nothing here does I/O: SharedHealth (state/upstream_health.py) carries the verdicts."""

from __future__ import annotations

from collections.abc import Callable

from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import Clock
from ballast.routing.targets import Target
from ballast.state.upstream_health import (
    CLOSED,
    DRAINED_NOW,
    ENABLED,
    FAILED,
    OPENED,
    SharedHealth,
    Verdict,
)


class FleetHealth:
    def __init__(
        self,
        shared: SharedHealth,
        clock: Clock,
        targets: Callable[[], dict[str, Target]],
        hold: float,
    ) -> None:
        self.shared = shared
        self.clock = clock
        self.targets = targets  # the deployments of the generation now serving
        self.hold = hold
        self.applied = 0
        self._hearing = False  # a transition caused by the fleet's verdict is not told back
        shared.listener = self.apply
        shared.deployments = lambda: list(targets())

    # -- this worker's verdicts -----------------------------------------------------------

    def failed(self, target: Target) -> None:
        """An attempt failed; told only while the breaker stays closed (its opening says the
        rest)."""
        if not self._hearing and target.breaker.state is BreakerState.CLOSED:
            self.shared.tell(Verdict(target.id, FAILED, origin=self.shared.origin))

    def transition(self, target: Target, state: BreakerState) -> None:
        if self._hearing:
            return
        if state is BreakerState.OPEN:
            self._tell_open(target)
        elif state is BreakerState.CLOSED:
            self.shared.tell(Verdict(target.id, CLOSED, origin=self.shared.origin))

    def probe_failed(self, target: Target, interval: float) -> None:
        """A background probe (one at a time in the fleet, by its lease) found it still
        down: every breaker stays open past the next probe, so recovery is found by that
        one probe and not by a live request on each worker whose open time ran out. Alone
        (Redis out of reach), the breaker's own half-open trial stays the way back."""
        if not self.shared.connected:
            return
        target.breaker.force_open(interval + self.hold)
        self._tell_open(target)

    def _tell_open(self, target: Target) -> None:
        cool = max(0.0, target.cooling_until - self.clock.monotonic())
        opened = target.breaker.retry_after()
        origin = self.shared.origin
        self.shared.tell(Verdict(target.id, OPENED, opened, min(cool, opened), origin))

    def drained(self, deployment: str, drained: bool) -> None:
        """An operator drained (or enabled) it: kept for instances that start later."""
        kind = DRAINED_NOW if drained else ENABLED
        self.shared.tell(Verdict(deployment, kind, origin=self.shared.origin))

    # -- the fleet's verdicts -------------------------------------------------------------

    def apply(self, verdict: Verdict) -> None:
        target = self.targets().get(verdict.deployment)
        if target is None:
            return
        self.applied += 1
        self._hearing = True
        try:
            _apply(target, verdict, self.clock.monotonic(), self.hold)
        finally:
            self._hearing = False


def _apply(target: Target, verdict: Verdict, now: float, hold: float) -> None:
    kind, breaker = verdict.kind, target.breaker
    if kind == FAILED:
        breaker.count_failure()
    elif kind == OPENED:
        if verdict.cool_for > 0:
            target.cooling_until = max(target.cooling_until, now + verdict.cool_for)
        breaker.force_open(verdict.open_for + hold)
    elif kind == CLOSED:
        if breaker.state is not BreakerState.CLOSED:
            target.recover()
    elif kind == DRAINED_NOW:
        target.drained = True
    elif kind == ENABLED:
        target.drained = False

"""One try of one deployment, from admission to its one verdict.

An Attempt holds the breaker permit and the health sample it was admitted with for as long as
it lasts: a whole answer's exchange, or a stream's whole life. It ends exactly once:
succeeded, failed (before its first token or after any number of them) or abandoned (the
client went away, or a hedge lost). A stream that breaks after its first token therefore
counts against the deployment like any other failure, and no path leaks a probe's lease."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ballast.config import RoutingSettings
from ballast.resilience import failures
from ballast.resilience.breaker import Permit
from ballast.resilience.clock import Clock
from ballast.resilience.failures import Failure
from ballast.routing.targets import Target

log = logging.getLogger("ballast.routing")


class Outcome(enum.Enum):
    LIVE = "live"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True)
class Verdicts:
    """What a failure says about a deployment: the breaker's verdict and any cooldown.
    `on_auth` hears of an upstream 401/403, which a request can cause by itself (a model
    the upstream key may not use): the refusal fails that request only, and the prober
    decides with the deployment's own key whether its credentials are bad."""

    routing: RoutingSettings
    clock: Clock
    on_event: Callable[[str, dict[str, Any]], None]
    on_auth: Callable[[Target], None] | None = None
    on_health_failure: Callable[[Target], None] | None = None  # the prober watches it

    def judge(self, target: Target, permit: Permit, failure: Failure) -> None:
        kind = failure.kind
        breaker = target.breaker
        if kind is failures.RATE_LIMITED or kind is failures.OVERLOADED:
            breaker.release(permit)
            seconds = failure.retry_after or self.routing.rate_limit_cooldown
            target.cooling_until = max(target.cooling_until, self.clock.monotonic() + seconds)
            breaker.force_open(seconds)
            self.on_event("cooldown", {"deployment": target.id, "seconds": failure.retry_after})
        elif kind is failures.UPSTREAM_AUTH:
            breaker.release(permit)
            log.warning(
                "deployment %s refused a request (%s); checking its credentials with a probe",
                target.id,
                failure.status,
            )
            if self.on_auth is not None:
                self.on_auth(target)
        elif kind is failures.POOL_TIMEOUT or kind is failures.UNSUPPORTED:
            breaker.release(permit)  # the deployment was not asked: no verdict
        elif kind.health_failure:
            breaker.record_failure(permit, failure.retry_after)
            if self.on_health_failure is not None:
                self.on_health_failure(target)
        else:
            breaker.record_success(permit)


class Attempt:
    """One deployment's try. `deadline` (monotonic) bounds it: the request's deadline or,
    sooner, the deployment's own `timeouts.request` from the attempt's start."""

    __slots__ = ("_verdicts", "deadline", "outcome", "permit", "started", "target", "ttft")

    def __init__(
        self, target: Target, permit: Permit, verdicts: Verdicts, request_deadline: float
    ) -> None:
        self.target = target
        self.permit = permit
        self._verdicts = verdicts
        self.started = verdicts.clock.monotonic()
        own = target.upstream.timeouts.request
        self.deadline = min(request_deadline, self.started + own)
        self.ttft: float | None = None
        self.outcome = Outcome.LIVE
        target.health.start()

    @property
    def id(self) -> str:
        return self.target.id

    @property
    def live(self) -> bool:
        return self.outcome is Outcome.LIVE

    def first_token(self) -> None:
        """The stream answered: its verdict comes when it ends, so a probe keeps its lease
        until then (the stream's clocks and deadline bound how long that is)."""
        self.ttft = self._verdicts.clock.monotonic() - self.started
        if self.permit.probe:
            self.target.breaker.hold(self.permit, self.deadline)

    def succeeded(self) -> None:
        if self.outcome is not Outcome.LIVE:
            return
        self.outcome = Outcome.SUCCEEDED
        latency = self._verdicts.clock.monotonic() - self.started
        self.target.breaker.record_success(self.permit)
        self.target.health.finish(True, latency=latency, ttft=self.ttft)

    def failed(self, failure: Failure) -> None:
        if self.outcome is not Outcome.LIVE:
            return
        self.outcome = Outcome.FAILED
        self._verdicts.judge(self.target, self.permit, failure)
        self.target.health.finish(not failure.kind.health_failure)

    def abandoned(self) -> None:
        """No verdict: the client left, or another attempt won. Frees a probe's lease."""
        if self.outcome is not Outcome.LIVE:
            return
        self.outcome = Outcome.ABANDONED
        self.target.breaker.release(self.permit)
        self.target.health.abandon()

    def __repr__(self) -> str:
        return f"Attempt({self.target.id!r}, {self.outcome.value})"

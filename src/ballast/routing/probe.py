"""Background probes of open deployments, so a recovered one is back in seconds.

While a deployment's breaker is open (or half-open with no live request to try it), the
gateway itself asks it every `probe_interval` seconds, backing off to `max_probe_interval`
while it keeps failing: a one-token completion where the deployment names its model, else
GET /models. No client request is spent on the question. A probe that answers closes the
breaker (`_recovered` says why not half-open). A deployment cooled down by a 429's
Retry-After is not probed before its cooldown ends. Probes are shared by every worker and
instance through a short Redis lock where there is one, so a deployment sees at most one
probe per interval in all.

The prober is also the evidence for an upstream 401/403: a client's request can provoke
one (a model the upstream key may not use, behind a wildcard), so a refusal alone fails only
that request, and it is the probe, made with the deployment's own key and nothing of the
client's, that says whether the credentials are bad and the deployment must cool down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from ballast.config import Settings
from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import Clock
from ballast.resilience.failures import Failure
from ballast.routing.targets import Target

log = logging.getLogger("ballast.probe")


class ProbeGate(Protocol):
    """One probe at a time across processes (state/probes.py: a lease in Redis)."""

    async def take(self, deployment: str, interval: float) -> bool:
        """True when this process may probe `deployment` now."""
        ...

    async def done(self, deployment: str, interval: float, took: float) -> None:
        """The probe ended after `took` seconds."""
        ...


class Prober:
    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        on_event: Callable[[str, dict[str, Any]], None],
        gate: ProbeGate | None = None,
        on_failed_probe: Callable[[Target, float], None] | None = None,
    ) -> None:
        breaker = settings.routing.breaker
        self.interval = breaker.probe_interval
        self.max_interval = max(breaker.max_probe_interval, breaker.probe_interval)
        self.backoff_after = breaker.probe_backoff_after
        self.auth_cooldown = settings.routing.auth_cooldown
        self.clock = clock
        self.on_event = on_event
        self.gate = gate
        self.on_failed_probe = on_failed_probe  # (target, the interval to the next probe)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False  # between the router's start and close

    def watch(self, target: Target) -> None:
        """Probe `target` until its breaker closes (a no-op while it is being probed)."""
        if not self._running or target.adapter.probe_request() is None:
            return
        task = self._tasks.get(target.id)
        if task is not None and not task.done():
            return
        self._tasks[target.id] = asyncio.get_running_loop().create_task(self._watch(target))

    def check_auth(self, target: Target) -> None:
        """A request was refused with 401/403: probe now, with the deployment's own key."""
        if not self._running or target.adapter.probe_request() is None:
            return
        task = self._tasks.get(target.id)
        if task is not None and not task.done():
            return
        self._tasks[target.id] = asyncio.get_running_loop().create_task(self._auth_check(target))

    def start(self) -> None:
        self._running = True

    async def close(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the loops ---------------------------------------------------------------------

    async def _watch(self, target: Target) -> None:
        interval = self.interval
        failing_since: float | None = None  # the first failed probe of this outage
        while self._running:
            wait = max(interval, target.cooling_until - self.clock.monotonic())
            await self.clock.sleep(wait)
            if not self._needs_probe(target):
                if self._closed_breaker(target) and target.health.errors() == 0:
                    break  # healthy again
                continue
            outcome = await self._probe(target)
            now = self.clock.monotonic()
            if outcome == "ok":
                self._recovered(target)
                interval, failing_since = self.interval, None
            elif outcome == "skipped":
                interval = self.interval
            elif failing_since is None or now - failing_since < self.backoff_after:
                failing_since = now if failing_since is None else failing_since
                interval = self.interval  # a short outage: its end is seen within an interval
            else:
                interval = min(interval * 2, self.max_interval)
            if outcome == "failed" and self.on_failed_probe is not None:
                self.on_failed_probe(target, interval)

    def _needs_probe(self, target: Target) -> bool:
        """Open; or half-open, or closed but penalised for its errors, while no live request
        comes to try it (health routing sends the traffic elsewhere meanwhile): ask it.
        Live traffic that ends with verdicts already tells what a probe would."""
        if target.drained:
            return False
        if target.breaker.state is BreakerState.OPEN:
            return True
        health = target.health
        quiet = self.clock.monotonic() - health.last_finish >= self.interval
        return quiet and health.in_flight == 0 and health.errors() > 0

    @staticmethod
    def _closed_breaker(target: Target) -> bool:
        return target.breaker.state is BreakerState.CLOSED

    async def _auth_check(self, target: Target) -> None:
        outcome = await self._probe(target, shared=False)
        if outcome != "auth":
            return
        log.error(
            "deployment %s refused our upstream credentials on a probe; cooling it down for %ss",
            target.id,
            self.auth_cooldown,
        )
        target.cooling_until = self.clock.monotonic() + self.auth_cooldown
        target.breaker.force_open(self.auth_cooldown)
        self.on_event("cooldown", {"deployment": target.id, "seconds": self.auth_cooldown})
        self._tasks.pop(target.id, None)
        self.watch(target)

    async def _probe(self, target: Target, shared: bool = True) -> str:
        """One probe: "ok", "auth" (401/403), "failed", or "skipped" (another worker's)."""
        request = target.adapter.probe_request()
        if request is None:
            return "skipped"
        gate = self.gate if shared else None
        if gate is not None and not await gate.take(target.id, self.interval):
            return "skipped"
        started = self.clock.monotonic()
        try:
            return await self._ask(target, request)
        finally:
            if gate is not None:
                await gate.done(target.id, self.interval, self.clock.monotonic() - started)

    async def _ask(self, target: Target, request: tuple[str, str, dict[str, Any] | None]) -> str:
        method, path, body = request
        upstream = target.upstream
        try:
            data = orjson.dumps(body) if body is not None else None
            wire = target.adapter.probe_wire(method, path, data)
            status, _ = await upstream.call_json(method, upstream.base_url + path, data, wire)
        except Failure:
            status = 0
        except Exception:
            log.exception("probe of %s failed unexpectedly", target.id)
            status = 0
        outcome = "ok" if 200 <= status < 300 else "auth" if status in (401, 403) else "failed"
        self.on_event("probe", {"deployment": target.id, "outcome": outcome})
        return outcome

    def _recovered(self, target: Target) -> None:
        """The probe answered: the breaker closes. A model list that answers while
        completions still fail costs a few failed attempts, each failed over silently,
        before the breaker opens again; waiting for a live request instead could wait for
        ever, since health routing sends none to a deployment with errors in its window."""
        target.recover()
        log.info("deployment %s answered a probe", target.id)

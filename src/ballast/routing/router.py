"""Routing, assembled: the deployments (targets), the attempt loop over them and the two
kinds of exchange. One Router per configuration generation."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ballast.config import ModelGroup, Settings
from ballast.observe.tracing import build_tracer
from ballast.providers.base import SessionSource
from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.handles import SharedSource
from ballast.routing.attempt_loop import AttemptLoop
from ballast.routing.dispatch import Dispatch
from ballast.routing.fleet_health import FleetHealth
from ballast.routing.probe import ProbeGate, Prober
from ballast.routing.targets import Target, Targets


class Router:
    def __init__(
        self,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        sessions: SessionSource | None = None,
        shared_handles: Callable[[str], SharedSource] | None = None,
        probe_gate: ProbeGate | None = None,
        fleet_health: FleetHealth | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_event = on_event or (lambda name, fields: None)
        self.sessions = sessions  # shared with the routers of later config generations
        self.shared_handles = shared_handles
        self.probe_gate = probe_gate
        self.fleet_health = fleet_health  # shared with later generations, like the gate
        self.prober = Prober(settings, clock, self._event, probe_gate, self._on_failed_probe)
        self.deployments = Targets(
            settings, clock, self.rng, self._event, sessions, shared_handles, self._on_state
        )
        self.tracer = build_tracer(settings.observe.tracing)
        self.loop = AttemptLoop(
            settings,
            self.deployments,
            clock,
            self.rng,
            self._event,
            self.tracer,
            on_auth=self.prober.check_auth,
            on_health_failure=self._on_health_failure,
        )
        routing = settings.routing
        self.dispatch = Dispatch(
            self.loop, clock, routing.answers_as_streams, routing.whole_answer_share
        )

    def _event(self, name: str, fields: dict[str, Any]) -> None:
        self.on_event(name, fields)

    def _on_state(self, target: Target, state: BreakerState) -> None:
        if state is BreakerState.OPEN:
            self.prober.watch(target)
        if self.fleet_health is not None:
            self.fleet_health.transition(target, state)

    def _on_failed_probe(self, target: Target, interval: float) -> None:
        if self.fleet_health is not None:
            self.fleet_health.probe_failed(target, interval)

    def _on_health_failure(self, target: Target) -> None:
        self.prober.watch(target)
        if self.fleet_health is not None:
            self.fleet_health.failed(target)

    @property
    def targets(self) -> dict[str, Target]:
        return self.deployments.by_id

    async def start(self) -> None:
        await self.deployments.start()
        self.prober.start()

    async def close(self) -> None:
        await self.prober.close()
        await self.deployments.close()

    def resolve(self, model: str) -> ModelGroup | None:
        return self.deployments.resolve(model)

    def public_models(self) -> list[str]:
        return self.deployments.public_models()

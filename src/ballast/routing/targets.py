"""Deployments at run time, and which model group a request's model names.

Each deployment becomes a Target: its provider adapter, its own pool (a bulkhead), its
circuit breaker and its health. Built once per configuration generation."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ballast.config import Deployment, ModelGroup, Settings, breaker_config
from ballast.providers import ADAPTERS, Adapter, AdapterContext
from ballast.providers.base import SessionSource
from ballast.resilience.breaker import BreakerState, CircuitBreaker
from ballast.resilience.clock import Clock
from ballast.resilience.handles import SharedSource
from ballast.routing.health import DeploymentHealth, choose
from ballast.upstream.client import Upstream

log = logging.getLogger("ballast.routing")


@dataclass(slots=True)
class Target:
    """A deployment at run time: its adapter and pool, its breaker and its health."""

    deployment: Deployment
    group: ModelGroup
    adapter: Adapter
    breaker: CircuitBreaker
    health: DeploymentHealth
    drained: bool = False
    cooling_until: float = 0.0  # monotonic: a Retry-After or auth cooldown runs until then
    id: str = field(init=False)  # the deployment's, read on every attempt
    upstream: Upstream = field(init=False)  # the adapter's pool

    def __post_init__(self) -> None:
        self.id = self.deployment.id
        self.upstream = self.adapter.upstream

    def ready(self, now: float) -> bool:
        """Not drained, not cooling down, its breaker closed: a deployment a preference
        (prompt-cache affinity) may put first. Half-open, it gets only what the strategy
        would give it."""
        return (
            not self.drained
            and self.cooling_until <= now
            and self.breaker.state is BreakerState.CLOSED
        )

    def recover(self) -> None:
        """A probe found it answering: the breaker closes, its errors are history (costs
        decide again) and any cooldown is over."""
        self.breaker.reset()
        self.health.window.clear()
        self.cooling_until = 0.0


class Targets:
    """Every deployment of one configuration, by id and by model group."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        rng: random.Random,
        on_event: Callable[[str, dict[str, Any]], None],
        sessions: SessionSource | None = None,
        shared_handles: Callable[[str], SharedSource] | None = None,
        on_state: Callable[[Target, BreakerState], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_state = on_state
        self.rng = rng
        self._on_event = on_event
        self.by_id: dict[str, Target] = {}
        self._by_group: dict[str, list[Target]] = {}
        self._exact: dict[str, ModelGroup] = {}
        self._wildcards: list[ModelGroup] = []
        config = breaker_config(settings.routing.breaker)
        routing = settings.routing
        for group in settings.models:
            if group.is_wildcard:
                self._wildcards.append(group)
            else:
                self._exact[group.name] = group
            members = []
            for dep in group.deployments:
                context = AdapterContext(
                    clock=clock,
                    handle_refresh_margin=routing.handle_refresh_margin,
                    sessions=sessions,
                    shared_handles=shared_handles(dep.id) if shared_handles else None,
                    on_event=on_event,
                )
                upstream = Upstream(dep, settings.timeouts_for(dep), settings.upstream, clock=clock)
                target = Target(
                    dep,
                    group,
                    ADAPTERS[dep.provider](dep, upstream, context),
                    CircuitBreaker(dep.id, config, clock, self._on_transition),
                    DeploymentHealth(dep.id, clock, window=routing.health_window),
                )
                self.by_id[dep.id] = target
                members.append(target)
            self._by_group[group.name] = members

    def _on_transition(self, name: str, old: BreakerState, new: BreakerState) -> None:
        log.warning("breaker %s: %s -> %s", name, old.value, new.value)
        self._on_event("breaker", {"deployment": name, "from": old.value, "to": new.value})
        target = self.by_id.get(name)
        if target is None:
            return
        if new is BreakerState.CLOSED:
            # Recovered: its failures are history, so health routing tries it again at once
            # (and a fast deployment gets its traffic back) instead of a window later.
            target.health.window.clear()
        if self._on_state is not None:
            self._on_state(target, new)

    def adopt(self, previous: Target) -> None:
        """Keep what is known of an unchanged deployment across a config reload: its breaker
        (whose transitions now reach this generation), its health, a drain, a cooldown."""
        target = self.by_id.get(previous.id)
        if target is None or target.deployment != previous.deployment:
            return
        target.breaker = previous.breaker
        target.breaker.on_transition = self._on_transition
        target.health = previous.health
        target.drained = previous.drained
        target.cooling_until = previous.cooling_until

    async def start(self) -> None:
        for target in self.by_id.values():
            await target.upstream.start()
            await target.adapter.start()
        warm = self.settings.upstream.warm_connections
        await asyncio.gather(*(t.upstream.warm(warm) for t in self.by_id.values()))

    async def close(self) -> None:
        for target in self.by_id.values():
            await target.adapter.close()
            await target.upstream.close()

    def values(self) -> list[Target]:
        return list(self.by_id.values())

    def resolve(self, model: str) -> ModelGroup | None:
        group = self._exact.get(model)
        if group is not None:
            return group
        for group in self._wildcards:
            if fnmatch.fnmatchcase(model, group.name):
                return group
        return None

    def public_models(self) -> list[str]:
        return [g.name for g in self.settings.models if not g.is_wildcard]

    def members(self, group: ModelGroup) -> list[Target]:
        return self._by_group[group.name]

    def ranked(self, group: ModelGroup) -> list[Target]:
        """The group's deployments, most preferred first, by the group's strategy."""
        members = self._by_group[group.name]
        if len(members) == 1:
            return members
        return choose(
            members,
            group.strategy,
            health=lambda t: t.health,
            weight=lambda t: t.deployment.weight,
            rng=self.rng,
        )

"""The root of the settings: every section, and the checks across them."""

from __future__ import annotations

from pydantic import Field, field_validator

from ballast.config.base import Section
from ballast.config.deployment import Deployment
from ballast.config.sections.budgets import BudgetSettings, ModelPrice
from ballast.config.sections.fleet import FleetSettings
from ballast.config.sections.jobs import JobsSettings
from ballast.config.sections.mcp import McpSettings
from ballast.config.sections.models import ModelGroup, serves
from ballast.config.sections.observe import ObserveSettings
from ballast.config.sections.routing import RoutingSettings
from ballast.config.sections.server import ServerSettings
from ballast.config.sections.state import StateSettings
from ballast.config.sections.upstream import UpstreamSettings
from ballast.config.timeouts import Timeouts


class Settings(Section):
    server: ServerSettings = ServerSettings()
    timeouts: Timeouts = Timeouts()
    upstream: UpstreamSettings = UpstreamSettings()
    routing: RoutingSettings = RoutingSettings()
    state: StateSettings = StateSettings()
    observe: ObserveSettings = ObserveSettings()
    fleet: FleetSettings = FleetSettings()
    jobs: JobsSettings = JobsSettings()
    mcp: McpSettings = McpSettings()
    budgets: BudgetSettings = BudgetSettings()
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="per model name as upstreams report it"
    )
    models: list[ModelGroup] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique(cls, groups: list[ModelGroup]) -> list[ModelGroup]:
        names = [g.name for g in groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate model names: {', '.join(dupes)}")
        ids = [d.id for g in groups for d in g.deployments]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate deployment ids: {', '.join(dupes)}")
        for group in groups:
            for other in [*group.fallbacks, *group.context_fallbacks]:
                if not serves(groups, other):
                    raise ValueError(f"model {group.name!r} falls back to unknown model {other!r}")
        return groups

    def serves(self, model: str) -> bool:
        """True when a request for `model` has a group to go to, or `model` is a job
        backend (the key admin asks, so a key's model list names only what exists: the
        models and job backends it may use)."""
        return serves(self.models, model) or model in self.jobs.backends

    def timeouts_for(self, deployment: Deployment) -> Timeouts:
        return deployment.timeouts.apply(self.timeouts)

"""What clients ask for: a model group, its deployments, its fallbacks (`models:`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from ballast.config.base import Section
from ballast.config.deployment import Deployment
from ballast.config.sections.cache import CacheSettings


class ModelGroup(Section):
    name: str = Field(min_length=1)
    deployments: list[Deployment] = Field(min_length=1)
    fallbacks: list[str] = Field(default_factory=list)
    context_fallbacks: list[str] = Field(default_factory=list)
    strategy: Literal["health", "ordered", "weighted"] = "health"
    affinity: Literal["prompt_cache", "off"] | None = Field(
        None,
        description="prompt_cache: a conversation's requests go to the deployment that"
        " answered it last while that one is healthy, so its prompt cache stays warm"
        " (docs/routing.md); unset: prompt_cache, except with strategy ordered",
    )
    cache: CacheSettings | None = None
    strict_params: bool = Field(
        False,
        description="refuse (400) a request with a parameter Ballast would have to drop on"
        " its way to a deployment of another API shape; false: drop it and name it in the"
        " x-ballast-dropped header, the request log and a metric",
    )

    @property
    def prompt_affinity(self) -> bool:
        """Conversations keep to a deployment: asked for, or by default where the strategy
        spreads them (`ordered` keeps them on its first deployment already, and a failover
        must not outlast the first one's recovery)."""
        affinity = self.affinity
        return affinity == "prompt_cache" or (affinity is None and self.strategy != "ordered")

    @property
    def is_wildcard(self) -> bool:
        return any(ch in self.name for ch in "*?[")


def serves(groups: Sequence[ModelGroup], model: str) -> bool:
    """True when a request for `model` resolves to one of the groups: its name, or a
    wildcard group's pattern it matches."""
    return any(
        g.name == model or (g.is_wildcard and fnmatch.fnmatchcase(model, g.name)) for g in groups
    )

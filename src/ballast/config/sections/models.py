"""What clients ask for: a model group, its deployments, its fallbacks (`models:`)."""

from __future__ import annotations

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
    cache: CacheSettings | None = None

    @property
    def is_wildcard(self) -> bool:
        return any(ch in self.name for ch in "*?[")

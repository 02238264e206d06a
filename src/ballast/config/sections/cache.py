"""A model group's response cache (`models[].cache`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ballast.config.base import Section


class CacheSettings(Section):
    """A model group's response cache (off unless the group has a `cache` section)."""

    ttl: float = Field(300.0, gt=0, description="seconds an answer is kept")
    coalesce: bool = Field(False, description="identical concurrent misses make one call")
    coalesce_wait: float = Field(30.0, gt=0, description="longest wait for that one call")
    scope: Literal["key", "global"] = Field("key", description="entries per API key, or shared")
    max_entry_bytes: int = Field(256 * 1024, ge=1, description="larger answers are not kept")

"""One vocabulary for every circuit breaker's settings, and the one mapping to the breaker.

Deployments, Redis and job backends are guarded by the one `CircuitBreaker`; their sections
subclass `BreakerSettings` only to give their own defaults, so a key means the same in each.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ballast.config.base import Section
from ballast.resilience.breaker import BreakerConfig

# The settings whose defaults differ between the breakers, declared once with their checks
# and meanings; a section gives each its own default.
FailureThreshold = Annotated[
    int, Field(ge=1, description="consecutive failures that open the breaker")
]
FailureRate = Annotated[
    float | None,
    Field(gt=0, le=1, description="failure share over `window` that opens it (null: off)"),
]
OpenTime = Annotated[float, Field(gt=0, description="first open period before a half-open probe")]
MaxOpenTime = Annotated[
    float | None,
    Field(gt=0, description="longest open period (null: `open_time`, it never grows)"),
]
OpenMultiplier = Annotated[
    float,
    Field(ge=1, description="growth of the open time at each failed half-open probe"),
]
ProbeTimeout = Annotated[
    float, Field(gt=0, description="a half-open trial without a verdict frees its slot")
]


class BreakerSettings(Section):
    """A circuit breaker: closed, open after failures, half-open for a probe."""

    failure_threshold: FailureThreshold = 10
    failure_rate: FailureRate = 0.5
    min_calls: int = Field(
        BreakerConfig.min_calls,
        ge=1,
        description="calls in the window before the failure rate counts",
    )
    window: float = Field(30.0, gt=0, description="seconds the failure rate is measured over")
    open_time: OpenTime = 5.0
    max_open_time: MaxOpenTime = 300.0
    probe_timeout: ProbeTimeout = 10.0
    half_open_probes: int = Field(1, ge=1, description="trial calls let through while half-open")
    open_multiplier: OpenMultiplier = 2.0


def breaker_config(settings: BreakerSettings) -> BreakerConfig:
    """The breaker's own configuration. An open period never exceeds `max_open_time`, and
    never falls short of `open_time` (a smaller maximum is raised to it)."""
    return BreakerConfig(
        failure_threshold=settings.failure_threshold,
        failure_rate=settings.failure_rate,
        window=settings.window,
        min_calls=settings.min_calls,
        open_time=settings.open_time,
        max_open_time=max(settings.max_open_time or 0.0, settings.open_time),
        open_multiplier=settings.open_multiplier,
        half_open_probes=settings.half_open_probes,
        probe_timeout=settings.probe_timeout,
    )

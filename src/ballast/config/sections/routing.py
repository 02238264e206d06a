"""The attempt loop's settings and each deployment's breaker (`routing:`)."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section
from ballast.config.breaker import BreakerSettings


class DeploymentBreakerSettings(BreakerSettings):
    """Each deployment's breaker (the defaults of `BreakerSettings`), and the background
    probes that look for an open deployment's recovery."""

    probe_interval: float = Field(
        2.0, gt=0, description="an open deployment is probed in the background this often"
    )
    max_probe_interval: float = Field(
        10.0, gt=0, description="failed background probes back off up to this interval"
    )
    probe_backoff_after: float = Field(
        30.0,
        ge=0,
        description="probes keep to probe_interval for this long into an outage before"
        " backing off, so a short outage is noticed to end within an interval",
    )


class RoutingSettings(Section):
    """The attempt loop's bounds. Retries are capped per request and, across requests, by a
    budget, so an outage cannot multiply upstream load (Envoy, Finagle)."""

    max_attempts: int = Field(5, ge=1)
    backoff_base: float = Field(0.05, ge=0)
    backoff_cap: float = Field(1.0, ge=0)
    retry_budget_ratio: float = Field(0.5, ge=0)
    retry_budget_min_per_second: float = Field(10.0, ge=0)
    rate_limit_cooldown: float = Field(5.0, gt=0, description="429 without Retry-After")
    auth_cooldown: float = Field(300.0, gt=0, description="our upstream key was refused")
    max_retry_after_wait: float = Field(5.0, ge=0)
    health_window: float = Field(60.0, gt=0)
    continuation: bool = True
    stream_keepalive: float | None = Field(
        15.0,
        gt=0,
        description="seconds without a first token before a stream's headers and an SSE"
        " comment go out (then one comment per interval); null: wait silently",
    )
    answers_as_streams: bool = Field(
        True,
        description="ask an upstream for a stream even when the client wants a whole answer,"
        " and assemble it, so the first-token and inter-chunk clocks guard it too",
    )
    whole_answer_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="a whole answer not guarded by the stream clocks (not asked for as a"
        " stream) may take this share of the request's time left, when another deployment or"
        " a fallback could still answer: so a silent upstream leaves time for a failover",
    )
    stream_headers_at_once: bool = Field(
        False, description="start every stream's response at once, before its first token"
    )
    handle_refresh_margin: float = Field(
        60.0, ge=0, description="renew a remote run's token this long before it expires"
    )
    hedge_after: float | None = Field(
        None, gt=0, description="start a second stream after this long without a first token"
    )
    hedge_on_p95: bool = Field(False, description="hedge after the deployment's p95 TTFT")
    affinity_entries: int = Field(
        50_000,
        ge=1,
        description="conversations each worker remembers the deployment of, for prompt-cache"
        " affinity (the least recently answered are forgotten first)",
    )
    affinity_ttl: float = Field(
        600.0,
        gt=0,
        description="seconds a conversation keeps to the deployment that answered it last,"
        " after its last answer (a provider's prompt cache lasts 5 to 10 minutes unused)",
    )
    breaker: DeploymentBreakerSettings = DeploymentBreakerSettings()

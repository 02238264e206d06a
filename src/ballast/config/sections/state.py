"""Redis, the database and what is kept in them (`state:`)."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from ballast.config.base import Section
from ballast.config.breaker import (
    BreakerSettings,
    FailureRate,
    FailureThreshold,
    MaxOpenTime,
    OpenMultiplier,
    OpenTime,
    ProbeTimeout,
)


class RedisBreakerSettings(BreakerSettings):
    """A slow Redis is worse than a dead one, so every call is timed and counted. After
    `failure_threshold` failed calls every use takes its local fallback at once; one probe
    after `open_time`, which does not grow."""

    failure_threshold: FailureThreshold = 5
    failure_rate: FailureRate = None
    open_time: OpenTime = Field(
        60.0, validation_alias=AliasChoices("open_time", "recovery_timeout")
    )
    max_open_time: MaxOpenTime = None
    probe_timeout: ProbeTimeout = 5.0
    open_multiplier: OpenMultiplier = 1.0


class StateSettings(Section):
    redis_url: str | None = None
    database_url: str = "sqlite+aiosqlite:///ballast.db"
    redis_timeout: float = Field(0.05, gt=0, description="per Redis call")
    redis_breaker: RedisBreakerSettings = RedisBreakerSettings()
    database_timeout: float = Field(5.0, gt=0)
    key_cache_ttl: float = Field(30.0, ge=0, description="how long a looked-up key is trusted")
    instances: int = Field(
        1,
        ge=1,
        description="the fewest instances assumed to share the limits (each enforces its share"
        " while Redis is down); the fleet's heartbeats in Redis count more as they come",
    )
    ratelimit_release_delay: float = Field(
        0.05, ge=0, description="longest a finished request's Redis release waits to be sent"
    )
    spend_flush_interval: float = Field(1.0, gt=0)
    spend_journal: str = "ballast-spend.journal"
    shared_limits: bool = Field(
        True,
        description="`serve --workers N` shares rate limits (a file next to the journal)",
    )
    cache_prefix: str = Field("ballast:cache:", description="Redis key prefix of the cache")
    cache_local_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="in-process response cache size without Redis"
    )

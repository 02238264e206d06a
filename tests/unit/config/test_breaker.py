"""Every breaker is configured in one vocabulary and mapped to the breaker one way: the
same keys mean the same breaker in `routing.breaker`, `state.redis_breaker` and a job
backend's `breaker`, and a former key name still reads."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.config import (
    ConfigError,
    RedisBreakerSettings,
    Settings,
    breaker_config,
    parse_settings,
)
from ballast.resilience.breaker import BreakerConfig

MODELS = [{"name": "m", "deployments": [{"id": "d", "url": "http://up"}]}]


def settings(
    routing: dict[str, Any] | None = None,
    redis: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    backend = {"protocol": "runpod", "url": "http://jobs", "breaker": job or {}}
    return parse_settings(
        {
            "routing": {"breaker": routing or {}},
            "state": {"redis_breaker": redis or {}},
            "jobs": {"backends": {"gpu": backend}},
            "models": MODELS,
        },
        environ or {},
    )


def breakers(s: Settings) -> tuple[BreakerConfig, BreakerConfig, BreakerConfig]:
    return (
        breaker_config(s.routing.breaker),
        breaker_config(s.state.redis_breaker),
        breaker_config(s.jobs.backends["gpu"].breaker),
    )


def test_the_same_keys_give_the_same_breaker_in_every_section() -> None:
    keys: dict[str, Any] = {
        "failure_threshold": 4,
        "failure_rate": 0.25,
        "min_calls": 8,
        "window": 12.0,
        "open_time": 3.0,
        "max_open_time": 40.0,
        "probe_timeout": 2.0,
        "half_open_probes": 2,
        "open_multiplier": 3.0,
    }
    routing, redis, job = breakers(settings(keys, keys, keys))
    assert routing == redis == job == BreakerConfig(**keys)


def test_each_section_keeps_its_own_defaults() -> None:
    routing, redis, job = breakers(settings())
    assert routing == BreakerConfig(
        failure_threshold=10, failure_rate=0.5, open_time=5.0, max_open_time=300.0
    )
    # Redis: no failure rate, and one fixed open period before each probe.
    assert redis == BreakerConfig(
        failure_threshold=5,
        failure_rate=None,
        open_time=60.0,
        max_open_time=60.0,
        open_multiplier=1.0,
        probe_timeout=5.0,
    )
    assert job == BreakerConfig(
        failure_threshold=3,
        failure_rate=None,
        open_time=30.0,
        max_open_time=600.0,
        probe_timeout=600.0,
    )


def test_recovery_timeout_is_still_read_as_the_redis_open_time() -> None:
    _, redis, _ = breakers(settings(redis={"recovery_timeout": 7}))
    assert (redis.open_time, redis.max_open_time) == (7.0, 7.0)
    assert RedisBreakerSettings(recovery_timeout=9).open_time == 9.0


def test_a_bad_recovery_timeout_is_named_as_written() -> None:
    with pytest.raises(ConfigError) as info:
        settings(redis={"recovery_timeout": 0})
    assert info.value.errors == [
        "state.redis_breaker.recovery_timeout: Input should be greater than 0"
    ]


def test_both_names_at_once_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        settings(redis={"open_time": 5, "recovery_timeout": 7})
    assert info.value.errors == [
        "state.redis_breaker.recovery_timeout: Extra inputs are not permitted"
    ]


@pytest.mark.parametrize("written", ["open_time", "recovery_timeout"])
def test_the_environment_overrides_the_redis_open_time_under_either_name(written: str) -> None:
    environ = {
        "BALLAST_REDIS_BREAKER_RECOVERY_TIMEOUT": "11",
        "BALLAST_REDIS_BREAKER_FAILURE_THRESHOLD": "2",
    }
    _, redis, _ = breakers(settings(redis={written: 3}, environ=environ))
    assert (redis.open_time, redis.max_open_time, redis.failure_threshold) == (11.0, 11.0, 2)


def test_a_maximum_below_the_open_time_is_raised_to_it() -> None:
    routing, redis, job = breakers(
        settings({"open_time": 50, "max_open_time": 20}, {"open_time": 90}, {"open_time": 900})
    )
    assert (routing.max_open_time, redis.max_open_time, job.max_open_time) == (50.0, 90.0, 900.0)

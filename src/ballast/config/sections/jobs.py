"""Serverless GPU job backends and the dispatcher that runs their jobs (`jobs:`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from ballast.config.base import Section
from ballast.config.breaker import (
    BreakerSettings,
    FailureRate,
    FailureThreshold,
    MaxOpenTime,
    OpenTime,
    ProbeTimeout,
)
from ballast.config.values import http_url


class JobBreakerSettings(BreakerSettings):
    """Counts submission and infrastructure failures of one job backend, never a job that
    is still running. The half-open trial frees itself after `probe_timeout`."""

    failure_threshold: FailureThreshold = 3
    failure_rate: FailureRate = None
    open_time: OpenTime = 30.0
    max_open_time: MaxOpenTime = 600.0
    probe_timeout: ProbeTimeout = 600.0


class JobBackendSettings(Section):
    """One serverless job backend. The remote owns the execution timeout; Ballast only gives
    up on a job after losing contact for longer than `lost_contact_timeout`."""

    protocol: Literal["runpod", "replicate", "http"]
    url: str
    api_key: SecretStr | None = None
    execution_timeout: float | None = Field(600.0, gt=0, description="passed to the remote")
    typical_duration: float = Field(120.0, gt=0, description="for the progress estimate")
    poll_interval: float = Field(2.0, gt=0)
    max_poll_interval: float = Field(30.0, gt=0)
    request_timeout: float = Field(10.0, gt=0, description="one call to the backend")
    lost_contact_timeout: float = Field(600.0, gt=0)
    retention: float = Field(1800.0, gt=0, description="how long the remote keeps results")
    max_queued: int = Field(1000, ge=0, description="jobs held while the breaker is open")
    breaker: JobBreakerSettings = JobBreakerSettings()
    body: dict[str, Any] = Field(default_factory=dict, description="extra submission fields")
    # The generic `http` protocol: where things are and what its statuses mean.
    submit_path: str = "/jobs"
    status_path: str = "/jobs/{id}"
    cancel_path: str = "/jobs/{id}/cancel"
    status_map: dict[str, Literal["queued", "running", "succeeded", "failed", "cancelled"]] = Field(
        default_factory=dict
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)


class JobsSettings(Section):
    backends: dict[str, JobBackendSettings] = Field(default_factory=dict)
    lease_time: float = Field(30.0, gt=0, description="a dead instance's jobs move after this")
    claim_interval: float = Field(0.5, gt=0)
    max_in_flight: int = Field(64, ge=1, description="backend calls at once per instance")
    max_wait: float = Field(60.0, ge=0, description="longest GET /v1/jobs/{id}?wait=")

"""Traces and metrics (`observe:`)."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section


class ObserveSettings(Section):
    tracing: bool = Field(
        False,
        description="OpenTelemetry spans, exported over OTLP/HTTP (needs the tracing extra);"
        " also on when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    per_key_metrics: bool = Field(
        True, description="token, cost and budget series per key id (never the key itself)"
    )
    max_key_series: int = Field(
        1000, ge=0, description="distinct key ids labelled per worker; later keys are 'other'"
    )
    recent_requests: int = Field(
        500,
        ge=0,
        description="requests whose metadata (never a body) each worker keeps for the admin UI",
    )

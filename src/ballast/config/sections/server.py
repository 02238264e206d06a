"""How Ballast listens and serves clients (`server:`)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from ballast.config.base import Section

MIN_MASTER_KEY = 16  # characters: a short master key is guessed long before any lock-out


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    master_key: SecretStr | None = Field(
        None,
        description=f"admin API; also a full-access key (at least {MIN_MASTER_KEY} characters;"
        " empty: none)",
    )
    dashboard_token: SecretStr | None = Field(None, description="read-only dashboard access")
    admin_failure_limit: int = Field(
        10,
        ge=1,
        description="wrong admin keys or dashboard tokens from one client address (per worker)"
        " before it is locked out",
    )
    admin_lockout: float = Field(
        60.0,
        gt=0,
        description="seconds an address is locked out of the admin API and the dashboard"
        " (429 with Retry-After), and the window its wrong keys are counted in",
    )
    max_in_flight: int = Field(
        1024, ge=1, description="proxied requests per worker; past it, 503 at once (shed)"
    )
    body_timeout: float = Field(30.0, gt=0, description="to receive a request's whole body")
    header_timeout: float = Field(10.0, gt=0, description="to receive a request's headers")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="a request's header block")
    keepalive_timeout: float = Field(30.0, gt=0, description="an idle client connection")
    client_write_timeout: float = Field(
        30.0,
        gt=0,
        description="a stream's write to a client that stopped reading; past it the stream"
        " is cut and its upstream connection released (counted as client_gone)",
    )
    shutdown_grace: float = Field(30.0, ge=0, description="SIGTERM: time to finish requests")
    accept_batch: int = Field(
        128,
        ge=1,
        description="new client connections accepted at once when the listening socket is"
        " ready (server/accept.py); a burst waits fewer turns of a busy event loop",
    )
    gc_young_threshold: int = Field(
        10_000,
        ge=0,
        description="new objects between young garbage collections once started (gc_tuning.py);"
        " 0 keeps Python's defaults",
    )

    @field_validator("master_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and 0 < len(value.get_secret_value()) < MIN_MASTER_KEY:
            raise ValueError(f"must be at least {MIN_MASTER_KEY} characters long")
        return value

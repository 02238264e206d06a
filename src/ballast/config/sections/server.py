"""How Ballast listens and serves clients (`server:`)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from ballast.config.base import Section


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    master_key: SecretStr | None = Field(None, description="admin API; also a full-access key")
    dashboard_token: SecretStr | None = Field(None, description="read-only dashboard access")
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

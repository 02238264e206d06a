"""The transport to every upstream: pools and size limits (`upstream:`)."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section


class UpstreamSettings(Section):
    pool_size: int = Field(256, ge=1, description="connections per deployment (a bulkhead)")
    keepalive_timeout: float = Field(60.0, gt=0)
    warm_connections: int = Field(1, ge=0, description="connections opened per deployment at start")
    max_response_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="a whole (non-streamed) answer, decoded; past it: 502, the connection"
        " dropped. A deployment's own setting replaces it (for embeddings too)",
    )
    max_embeddings_response_bytes: int = Field(
        160 * 1024 * 1024,
        ge=1024,
        description="a whole embeddings answer (thousands of vectors as JSON floats)",
    )
    max_event_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="one server-sent event of a streamed answer"
    )
    max_kept_chars: int = Field(
        1_000_000,
        ge=0,
        description="text of a stream kept for continuation (content, reasoning, tool"
        " arguments); a longer stream is relayed whole but not continued",
    )
    expose_headers: list[str] = Field(
        ["openai-processing-ms", "openai-version"],
        description="upstream answer headers a client may see (a trailing * matches a prefix);"
        " every other upstream header stays with Ballast",
    )

"""The MCP gateway (`mcp:`): the tool servers behind `/mcp`, how their tools are named, and
the clocks and breaker each one is held to."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from ballast.config.base import Section
from ballast.config.breaker import (
    BreakerSettings,
    FailureRate,
    FailureThreshold,
    MaxOpenTime,
    OpenTime,
    ProbeTimeout,
)
from ballast.config.values import header_problem, http_url

# A server's name is the prefix of its tools' names: letters, digits, `-` and `_`, so the
# prefixed name is one most clients accept.
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


class McpBreakerSettings(BreakerSettings):
    """Counts failures of one tool server (no answer, 5xx, a timeout), never a tool's own
    error result: a tool that says "not found" is a server that works."""

    failure_threshold: FailureThreshold = 5
    failure_rate: FailureRate = None
    open_time: OpenTime = 5.0
    max_open_time: MaxOpenTime = 60.0
    probe_timeout: ProbeTimeout = 30.0


class McpServerSettings(Section):
    """One upstream MCP server (Streamable HTTP). Its credential goes in `headers` (values
    from the environment: `Bearer ${TOKEN}`); a client's own token never reaches it."""

    name: str = Field(description="the server's name, and its tools' prefix")
    url: str = Field(description="the server's MCP endpoint (Streamable HTTP)")
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="sent on every request to it (its credential)"
    )
    revision: Literal["auto", "2025-11-25", "2026-07-28"] = Field(
        "auto",
        description="`auto`: try the stateless revision first, fall back to initialize (found"
        " out once); a revision here skips the question",
    )
    call_timeout: float = Field(30.0, gt=0, description="one tools/call, sent to answered")
    tool_timeouts: dict[str, float] = Field(
        default_factory=dict, description="call_timeout per tool (its name on the server)"
    )
    list_timeout: float = Field(
        5.0, gt=0, description="a list call or a handshake; past it the server is down"
    )
    connect_timeout: float = Field(3.0, gt=0, description="TCP and TLS connect")
    list_retries: int = Field(1, ge=0, description="list calls tried again after a failure")
    idempotent_tools: list[str] = Field(
        default_factory=list, description="tools whose calls may be tried again once"
    )
    pool_size: int = Field(32, ge=1, description="connections to the server at most")
    heal_backoff: float = Field(
        1.0, gt=0, description="after a failed (re-)initialize, calls fail fast this long"
    )
    max_heal_backoff: float = Field(
        30.0, gt=0, description="the longest that pause grows to after repeated failures"
    )
    breaker: McpBreakerSettings = McpBreakerSettings()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SERVER_NAME.match(value):
            raise ValueError(
                "an MCP server's name is 1-32 letters, digits, '-' or '_' (it prefixes tools)"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, text in value.items():
            problem = header_problem(name, text.get_secret_value())
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("tool_timeouts")
    @classmethod
    def _tool_timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        if any(seconds <= 0 for seconds in value.values()):
            raise ValueError("a tool's timeout must be > 0")
        return value

    def timeout_for(self, tool: str) -> float:
        return self.tool_timeouts.get(tool, self.call_timeout)


class McpSettings(Section):
    """`/mcp`: one endpoint in front of `servers`; a tool is named
    `<server><separator><tool>`."""

    servers: list[McpServerSettings] = Field(default_factory=list)
    separator: str = Field(
        "__", min_length=1, max_length=4, description="between a server's name and its tool's"
    )
    max_name_length: int = Field(
        64,
        ge=16,
        description="longest tool name shown (a longer one is shortened with a hash); lower"
        " it by the length of a client's own prefix",
    )
    on_server_down: str = Field(
        "hide",
        pattern="^(hide|error)$",
        description="`hide`: a down server's tools leave the list; `error`: they stay and"
        " a call fails fast with a tool error",
    )
    session_idle: float = Field(
        1800.0, gt=0, description="a client session unused this long is forgotten"
    )
    max_sessions: int = Field(10_000, ge=1, description="client sessions kept at most")
    max_message_bytes: int = Field(
        1024 * 1024, ge=1024, description="largest client message; larger ones get 413"
    )
    max_answer_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="largest answer read from a server"
    )

    @model_validator(mode="after")
    def _unique(self) -> McpSettings:
        names = [s.name for s in self.servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate MCP server names: {', '.join(dupes)}")
        clash = [n for n in names if self.separator in n]
        if clash:
            raise ValueError(f"MCP server name {clash[0]!r} holds the separator {self.separator!r}")
        return self

    def server(self, name: str) -> McpServerSettings | None:
        return next((s for s in self.servers if s.name == name), None)

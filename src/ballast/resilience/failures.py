"""The one error taxonomy: every upstream outcome becomes a Failure with a kind, and each kind
says once what the router does with it and what the client sees if nothing else answers."""

from __future__ import annotations

import enum
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import orjson


class Action(enum.Enum):
    RETRY = "retry"  # transient: the same deployment may be tried again after a backoff
    FAILOVER = "failover"  # move on to another deployment; do not retry this one now
    CONTEXT_FALLBACK = "context_fallback"  # only the group's context_fallbacks can answer
    RETURN = "return"  # the answer belongs to the client as it is (no retry anywhere)


@dataclass(frozen=True, slots=True)
class Kind:
    label: str  # low-cardinality metric and log label
    action: Action
    status: int  # what the client gets when this is the last word
    error_type: str
    code: str
    health_failure: bool  # counts against the deployment's health and breaker


CONNECT = Kind("connect_error", Action.RETRY, 502, "api_error", "upstream_unreachable", True)
POOL_TIMEOUT = Kind("pool_timeout", Action.FAILOVER, 503, "api_error", "upstream_busy", False)
RESET = Kind("reset", Action.RETRY, 502, "api_error", "upstream_reset", True)
SERVER_ERROR = Kind("server_error", Action.RETRY, 502, "api_error", "upstream_error", True)
FIRST_TOKEN_TIMEOUT = Kind(
    "first_token_timeout", Action.FAILOVER, 504, "timeout", "upstream_timeout", True
)
REQUEST_TIMEOUT = Kind("request_timeout", Action.FAILOVER, 504, "timeout", "upstream_timeout", True)
INTER_CHUNK_TIMEOUT = Kind(
    "inter_chunk_timeout", Action.FAILOVER, 504, "timeout", "upstream_stalled", True
)
STREAM_CUT = Kind("stream_cut", Action.FAILOVER, 502, "api_error", "upstream_stream_cut", True)
BAD_RESPONSE = Kind("bad_response", Action.RETRY, 502, "api_error", "upstream_bad_response", True)
RATE_LIMITED = Kind("rate_limited", Action.FAILOVER, 429, "rate_limit_error", "rate_limited", False)
# The provider as a whole has no capacity now (Anthropic's 529 `overloaded_error`): unlike a
# rate limit it says nothing of our quota, so it counts against health, and unlike a plain
# 5xx it asks for a pause, so the deployment cools down for its Retry-After.
OVERLOADED = Kind("overloaded", Action.RETRY, 503, "api_error", "upstream_overloaded", True)
# Not a health failure by itself: a request can provoke it (see routing/probe.py).
UPSTREAM_AUTH = Kind(
    "upstream_auth", Action.FAILOVER, 502, "api_error", "upstream_auth_failed", False
)
CONTEXT_LENGTH = Kind(
    "context_length",
    Action.CONTEXT_FALLBACK,
    400,
    "invalid_request_error",
    "context_length_exceeded",
    False,
)
CONTENT_FILTER = Kind(
    "content_filter", Action.RETURN, 400, "invalid_request_error", "content_filter", False
)
CLIENT_ERROR = Kind(
    "client_error", Action.RETURN, 400, "invalid_request_error", "bad_request", False
)
# A request this deployment's provider cannot express (Messages has no audio part, a
# provider serves no embeddings): another provider in the group may, so it fails over
# without touching the deployment's health.
UNSUPPORTED = Kind(
    "unsupported", Action.FAILOVER, 400, "invalid_request_error", "unsupported_request", False
)

_CONTENT_FILTER_CODES = {"content_filter", "content_policy_violation", "content_filtered"}


@dataclass(slots=True)
class Failure(Exception):
    """One failed attempt. `status`/`body` hold the upstream's own answer when there was one,
    so a pass-through error reaches the client unchanged."""

    kind: Kind
    message: str
    status: int | None = None
    body: bytes | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    retry_after: float | None = None
    deployment: str | None = None

    def __str__(self) -> str:
        return f"{self.kind.label}: {self.message}"


def openai_error_body(
    message: str, error_type: str, code: str | None = None, param: str | None = None
) -> bytes:
    """OpenAI's error body: the one rendering of it, for errors Ballast answers in OpenAI's
    shape and for provider errors the chat wires pass on as OpenAI's."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


def error_code(body: bytes | None) -> str | None:
    """The OpenAI-style `error.code` of an upstream body, if it has one."""
    if not body:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return code if isinstance(code, str) else None
    return None


def classify_status(status: int, body: bytes | None) -> Kind:
    """Kind of a non-2xx upstream answer."""
    if status == 429:
        return RATE_LIMITED
    if status in (401, 403):
        return UPSTREAM_AUTH
    if status >= 500:
        return SERVER_ERROR
    code = error_code(body)
    if code == "context_length_exceeded":
        return CONTEXT_LENGTH
    if code in _CONTENT_FILTER_CODES:
        return CONTENT_FILTER
    if status == 408:
        return REQUEST_TIMEOUT
    return CLIENT_ERROR


def failure_for_status(
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    retry_after: float | None,
    deployment: str,
) -> Failure:
    kind = classify_status(status, body)
    return Failure(
        kind,
        f"upstream answered {status}",
        status=status,
        body=body,
        headers=headers,
        retry_after=retry_after,
        deployment=deployment,
    )


UNAVAILABLE = Kind("unavailable", Action.RETURN, 503, "api_error", "no_healthy_deployment", False)
BUDGET_EXHAUSTED = Kind(
    "retry_budget_exhausted", Action.RETURN, 503, "api_error", "retry_budget_exhausted", False
)
HANDLE_UNAVAILABLE = Kind(
    "handle_unavailable", Action.FAILOVER, 503, "api_error", "upstream_session_unavailable", True
)


def drop_references(error: BaseException) -> None:
    """Let go of what an error only carries for a traceback: the locals of the finished
    frames it passed through, and a context that `raise ... from None` hid (still kept in
    `__context__`: orjson's JSONDecodeError holds the whole document it failed on). A
    recorded failure lives as long as its request, often in a reference cycle through the
    frame that caught it (which the tuned collector finds late); it must not keep the answer
    it failed on (a body read whole, an aborted read's buffer) alive with it."""
    for seen in _chain(error):
        if seen.__traceback__ is not None:
            traceback.clear_frames(seen.__traceback__)
        if seen.__suppress_context__:
            seen.__context__ = None


def forget_traceback(error: BaseException) -> None:
    """Drop the tracebacks of an error handled for good, and of its causes: nothing prints
    them any more, and each holds the frames it went through, which often hold the error."""
    for seen in _chain(error):
        seen.__traceback__ = None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """An error and its causes (or contexts), each read after the one before was handled."""
    seen: BaseException | None = error
    for _ in range(16):  # a context chain is short; a cycle in it must not loop
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__

"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}` with the
status codes Anthropic's API uses (an overloaded gateway is a 529, not a 503)."""

from __future__ import annotations

import orjson

from ballast.pipeline.errors import ApiError

# status -> (Anthropic's status, Anthropic's error type)
_BY_STATUS = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}
# An OpenAI error type (the pipeline's, and a broken stream's) -> Anthropic's.
_BY_TYPE = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "insufficient_quota": "rate_limit_error",
    "timeout": "timeout_error",
    "api_error": "api_error",
}


def status_and_type(status: int) -> tuple[int, str]:
    known = _BY_STATUS.get(status)
    if known is not None:
        return known
    if status >= 500:
        return 500, "api_error"  # a 502 is not an Anthropic status: the gateway's own fault
    return status, "invalid_request_error"


def error_json(error_type: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})


def render(error: ApiError) -> tuple[int, bytes]:
    """An ApiError before the response started."""
    status, error_type = status_and_type(error.status)
    return status, error_json(error_type, error.message)


def event(error_type: str, message: str) -> bytes:
    """The `error` event that ends a started stream."""
    return b"event: error\ndata: " + error_json(error_type, message) + b"\n\n"


def stream_event(error: ApiError) -> bytes:
    return event(status_and_type(error.status)[1], error.message)


def relay_event(error: ApiError) -> bytes:
    """The relay's error for a stream that broke past healing, in this shape (its type
    mapped from the failure's OpenAI type)."""
    return event(_BY_TYPE.get(error.error_type, "api_error"), error.message)


def passthrough(status: int, body: bytes) -> tuple[int, bytes]:
    """An upstream's own refusal (given in OpenAI's shape), with its message kept."""
    message = None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        given = payload.get("error")
        if isinstance(given, dict):
            message = given.get("message")
        elif isinstance(given, str):
            message = given
    if not isinstance(message, str) or not message:
        message = f"The upstream refused the request (status {status})."
    anthropic_status, error_type = status_and_type(status)
    return anthropic_status, error_json(error_type, message)

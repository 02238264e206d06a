"""Errors in Anthropic's form: an upstream's own message passed through, the gateway's statuses
mapped to Anthropic's error types."""

from __future__ import annotations

import orjson
import pytest

from ballast.api.messages.errors import passthrough, render
from ballast.pipeline.errors import ApiError


def test_passthrough_keeps_the_upstreams_message_and_maps_the_status() -> None:
    body = orjson.dumps({"error": {"message": "too long", "type": "invalid_request_error"}})
    status, out = passthrough(400, body)
    assert status == 400
    assert orjson.loads(out) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too long"},
    }
    status, out = passthrough(409, b"<html>")
    assert status == 409 and b"status 409" in out


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, (401, "authentication_error")), (403, (403, "permission_error")),
     (404, (404, "not_found_error")), (429, (429, "rate_limit_error")),
     (502, (500, "api_error")), (503, (529, "overloaded_error")), (504, (504, "timeout_error"))],
)  # fmt: skip
def test_error_statuses(status: int, expected: tuple[int, str]) -> None:
    out_status, body = render(ApiError(status, "m"))
    assert (out_status, orjson.loads(body)["error"]["type"]) == expected

"""Header values: configured ones are refused when the config loads, with an error that names
the deployment and the header but never shows the value; values that arrive with a request
are refused when their line is written, never altered."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ballast.config import ConfigError, Deployment, parse_settings
from ballast.upstream import http1
from ballast.upstream.client import _request_id_line

SECRET = "sk-live-9f8e7d"


def config(deployment: dict[str, Any]) -> dict[str, Any]:
    base = {"id": "eu-1", "url": "http://127.0.0.1:1/v1"}
    return {"models": [{"name": "m", "deployments": [{**base, **deployment}]}]}


BAD_VALUES = {
    "nul": SECRET + "\x00",
    "cr": SECRET + "\rx-admin: 1",
    "lf": SECRET + "\nx-admin: 1",
    "escape": SECRET + "\x1b[2J",
    "del": SECRET + "\x7f",
    "beyond-latin-1": SECRET + "\u2019",
    "latin-1-but-not-ascii": SECRET + "\u00e9",
}


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_a_bad_configured_header_value_is_refused_at_load(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(config({"headers": {"X-Org-Key": value}}))
    message = str(caught.value)
    assert "'eu-1'" in message and "'X-Org-Key'" in message
    assert SECRET not in message


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_a_bad_api_key_is_refused_at_load(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(config({"api_key": value}))
    message = str(caught.value)
    assert "'eu-1'" in message and "api_key" in message
    assert SECRET not in message


def test_the_pydantic_error_itself_does_not_show_the_value() -> None:
    with pytest.raises(ValidationError) as caught:
        Deployment(id="eu-1", url="http://127.0.0.1:1/v1", headers={"X-Org-Key": SECRET + "\0"})
    assert SECRET not in str(caught.value)


def test_printable_values_and_tabs_are_accepted() -> None:
    settings = parse_settings(config({"api_key": SECRET, "headers": {"X-Org": "a\tb c!~"}}))
    assert settings.models[0].deployments[0].headers == {"X-Org": "a\tb c!~"}


def test_a_request_time_value_is_refused_rather_than_altered() -> None:
    for value in ("a\x00b", "a\x01b", "snow\u2603"):
        with pytest.raises(ValueError):
            http1.header_line("x-request-id", value)
    assert http1.header_line("x-a", "caf\u00e9\tok") == b"x-a: caf\xe9\tok\r\n"
    assert _request_id_line("req\x00id") == b""
    assert _request_id_line("req-1") == b"x-request-id: req-1\r\n"

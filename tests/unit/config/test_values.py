"""A configured URL that is not one says why, at the setting that holds it, without
repeating the value (a URL may carry a password)."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.config import ConfigError, parse_settings


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_settings(data, environ={})
    return caught.value.errors


def _deployment_url(url: str) -> list[str]:
    return _errors({"models": [{"name": "m", "deployments": [{"id": "a", "url": url}]}]})


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("api.openai.com/v1", "it has no scheme; add http:// or https:// at its start"),
        ("localhost:8000", "it has no scheme; add http:// or https:// at its start"),
        ("ftp://files.example.com", "its scheme must be http:// or https://"),
        ("HTTPS://api.example.com", "write its scheme in lower case (http:// or https://)"),
        ("http://api.example .com/v1", "it contains a space or another blank"),
        ("http:///v1", "it has no host after the scheme"),
        ("http://[::1::1]:80/v1", "(bad IPv6 literal)"),
    ],
)
def test_a_deployment_url_that_is_not_one_says_why(url: str, why: str) -> None:
    (line,) = _deployment_url(url)
    assert line.startswith("models[0].deployments[0].url: not a URL")
    assert line.endswith(why)


def test_a_job_backend_url_without_a_scheme_says_so_too() -> None:
    data = {
        "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]}],
        "jobs": {"backends": {"gpu": {"protocol": "runpod", "url": "api.runpod.ai/v2/abc"}}},
    }
    assert _errors(data) == [
        "jobs.backends.gpu.url: not a URL: it has no scheme; add http:// or https:// at its start"
    ]


def test_the_reason_never_repeats_the_value() -> None:
    (line,) = _deployment_url("user:sk-live-secret@gateway.internal:8443")
    assert "sk-live-secret" not in line and "no scheme" in line


def test_urls_that_are_fine_stay_fine() -> None:
    for url in ("http://127.0.0.1:9/v1/", "https://[::1]:8443", "https://api.example.com"):
        settings = parse_settings(
            {"models": [{"name": "m", "deployments": [{"id": "a", "url": url}]}]}, environ={}
        )
        assert settings.models[0].deployments[0].url == url.rstrip("/")

"""The provider names are listed once, in the config's catalogue: the config accepts exactly
them, and the adapters' registry serves exactly them."""

from __future__ import annotations

from typing import get_args

import pytest

from ballast.config import (
    DEFAULT_URLS,
    PRESETS,
    PROVIDERS,
    ConfigError,
    ProviderName,
    parse_settings,
)
from ballast.providers import ADAPTERS


def test_the_registry_serves_exactly_the_catalogue() -> None:
    assert len(set(PROVIDERS)) == len(PROVIDERS)
    assert sorted(ADAPTERS) == sorted(PROVIDERS)


def test_the_config_accepts_exactly_the_catalogue() -> None:
    assert get_args(ProviderName) == PROVIDERS
    assert set(PRESETS) | set(DEFAULT_URLS) <= set(PROVIDERS)


def test_an_unknown_provider_is_refused_with_every_name() -> None:
    deployment = {"id": "d", "url": "http://up", "provider": "nope"}
    with pytest.raises(ConfigError) as info:
        parse_settings({"models": [{"name": "m", "deployments": [deployment]}]}, {})
    (error,) = info.value.errors
    assert error.startswith("models[0].deployments[0].provider: Input should be ")
    assert all(f"'{name}'" in error for name in PROVIDERS)


@pytest.mark.parametrize("provider", sorted(DEFAULT_URLS))
def test_a_provider_with_a_default_url_needs_none(provider: str) -> None:
    deployment = {"id": "d", "provider": provider, "api_key": "k"}
    parsed = parse_settings({"models": [{"name": "m", "deployments": [deployment]}]}, {})
    assert parsed.models[0].deployments[0].url == DEFAULT_URLS[provider].rstrip("/")

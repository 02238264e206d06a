"""The admin API's key and team fields: a request with several bad fields hears of every
one of them in one 400, and a key's model list names only models the config serves."""

from __future__ import annotations

import pytest

from ballast.api.key_fields import MAX_INT, key_changes, key_options, team_options
from ballast.config import parse_settings
from ballast.pipeline.errors import ApiError

SETTINGS = parse_settings(
    {
        "models": [
            {"name": "chat", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]},
            {"name": "claude-*", "deployments": [{"id": "b", "url": "http://127.0.0.1:9"}]},
        ]
    },
    environ={},
)


def _refused(call: object) -> ApiError:
    assert callable(call)
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == 400
    return caught.value


def test_every_bad_field_of_a_new_key_is_named() -> None:
    error = _refused(lambda: key_options({"name": " ", "rpm": 0, "budget": -1, "tpm": 5}))
    assert error.param == "name, rpm, budget"
    assert error.message == (
        "'name' must be a non-empty string."
        f" 'rpm' must be an integer from 1 to {MAX_INT}."
        " 'budget' must be a number from 0 to 1000000000000."
    )


def test_one_bad_field_is_the_error_it_was() -> None:
    error = _refused(lambda: key_options({"name": "ok", "budget_period": "week"}))
    assert (error.param, error.message) == (
        "budget_period",
        "'budget_period' must be day, month or total.",
    )


def test_every_bad_change_is_named() -> None:
    error = _refused(lambda: key_changes({"id": "k", "rpm": -1, "name": None, "key_hash": "x"}))
    assert error.param == "rpm, name, key_hash"
    assert "'name' cannot be null." in error.message
    assert "'key_hash' cannot be changed." in error.message


def test_a_team_without_a_name_and_with_a_bad_limit_hears_of_both() -> None:
    error = _refused(lambda: team_options({"tpm": 0}))
    assert error.param == "tpm, name"
    assert error.message.endswith("'name' is required.")


def test_a_key_may_name_only_models_the_config_serves() -> None:
    serves = SETTINGS.serves
    allowed = key_options({"name": "k", "models": ["chat", "claude-3-haiku"]}, serves)
    assert allowed["models"] == ["chat", "claude-3-haiku"]  # a wildcard group's match too
    error = _refused(lambda: key_options({"name": "k", "models": ["chat", "nope"]}, serves))
    assert (error.param, error.message) == (
        "models",
        "'models' names a model the config does not serve: 'nope'.",
    )
    error = _refused(lambda: key_changes({"models": ["gpt-4o"], "rpm": 0}, serves=serves))
    assert error.param == "rpm, models" and "'gpt-4o'" in error.message
    assert key_changes({"models": None}, serves=serves) == {"models": None}  # cleared: any

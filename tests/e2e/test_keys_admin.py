"""Keys an organisation can run: update a key's limits, budget, models, expiry and team;
rotate it with a grace period; list keys with limits and spend; teams of keys sharing a
budget and limits, with their own spend; budgets per model. Through the admin API, with the
official OpenAI SDK as the client (embedded SQLite)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_access import MASTER, admin, client, new_key
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
ANSWER = 5  # tokens an answer has; only output is priced, $1 a token


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim(f"ok?tokens={ANSWER}")
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": {"input": 0.0, "output": 1_000_000.0}},
            "models": [
                group("chat", deployment("a", sim, model="sim-chat")),
                group("other", deployment("b", sim, model="sim-chat")),
            ],
        }
    )


def ask(gw: Gateway, key: str, model: str = "chat") -> Any:
    return client(gw, key).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=ANSWER
    )


def test_an_update_takes_effect_at_once(gateway: Gateway) -> None:
    key, key_id = new_key(gateway, rpm=1)
    ask(gateway, key)
    with pytest.raises(openai.RateLimitError):
        ask(gateway, key)
    status, body = admin(gateway, "POST", "/admin/keys/update", {"id": key_id, "rpm": None})
    assert (status, body["rpm"]) == (200, None)
    ask(gateway, key)
    admin(gateway, "POST", "/admin/keys/update", {"id": key_id, "models": ["other"]})
    with pytest.raises(openai.PermissionDeniedError):
        ask(gateway, key)
    ask(gateway, key, "other")
    # A budget set now counts the period's spend so far (three answers, once flushed).
    _eventually(lambda: _listed(gateway, "/admin/keys", key_id)["spend"] == 3 * ANSWER)
    admin(gateway, "POST", "/admin/keys/update", {"id": key_id, "budget": 5.0 * ANSWER})
    ask(gateway, key, "other")
    ask(gateway, key, "other")
    with pytest.raises(openai.RateLimitError) as info:
        ask(gateway, key, "other")
    assert info.value.code == "insufficient_quota"
    admin(gateway, "POST", "/admin/keys/update", {"id": key_id, "expires_at": time.time() - 1})
    with pytest.raises(openai.AuthenticationError):
        ask(gateway, key, "other")
    for bad in ({"rpm": 2**31}, {"name": "a\x00"}, {"name": None}, {"key_hash": "x"}):
        status, body = admin(gateway, "POST", "/admin/keys/update", {"id": key_id, **bad})
        assert (status, body["error"]["param"]) == (400, next(iter(bad))), body
    status, _ = admin(gateway, "POST", "/admin/keys/update", {"id": "key_none", "rpm": 1})
    assert status == 404


def test_rotation_the_new_key_works_at_once_and_the_old_one_until_its_grace_ends(
    gateway: Gateway,
) -> None:
    old, key_id = new_key(gateway)
    ask(gateway, old)
    status, body = admin(
        gateway, "POST", "/admin/keys/rotate", {"id": key_id, "grace_seconds": 1.0}
    )
    assert status == 200 and body["id"] == key_id
    new = body["key"]
    assert new != old
    ask(gateway, new)
    ask(gateway, old)  # within the grace period
    time.sleep(1.3)
    with pytest.raises(openai.AuthenticationError):
        ask(gateway, old)
    ask(gateway, new)
    # Without a grace period the old value stops at once.
    status, body = admin(gateway, "POST", "/admin/keys/rotate", {"id": key_id})
    with pytest.raises(openai.AuthenticationError):
        ask(gateway, new)
    ask(gateway, body["key"])


def _listed(gw: Gateway, path: str, item_id: str) -> dict[str, Any]:
    status, body = admin(gw, "GET", path)
    assert status == 200
    return next(item for item in body["data"] if item["id"] == item_id)


def _eventually(predicate: Any) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_keys_are_listed_with_limits_and_spend(gateway: Gateway) -> None:
    key, key_id = new_key(gateway, rpm=7, budget=100.0, budget_period="total")
    ask(gateway, key)
    listed = _listed(gateway, "/admin/keys", key_id)
    assert (listed["rpm"], listed["budget"], listed["period"]) == (7, 100.0, "total")
    assert listed["spend"] == pytest.approx(ANSWER)
    assert "key" not in listed and "key_hash" not in listed


def test_a_team_shares_one_budget_and_one_set_of_limits(gateway: Gateway) -> None:
    status, team = admin(
        gateway,
        "POST",
        "/admin/teams",
        {"name": "research", "budget": 3.0 * ANSWER, "budget_period": "total"},
    )
    assert status == 201
    first, first_id = new_key(gateway, team_id=team["id"])
    second, second_id = new_key(gateway, team_id=team["id"])
    ask(gateway, first)
    ask(gateway, first)
    ask(gateway, second)
    for key in (first, second):
        with pytest.raises(openai.RateLimitError) as info:
            ask(gateway, key)
        assert info.value.code == "insufficient_quota"
    _eventually(
        lambda: _listed(gateway, "/admin/teams", team["id"])["spend"] == pytest.approx(3 * ANSWER)
    )
    assert sorted(_listed(gateway, "/admin/teams", team["id"])["keys"]) == sorted(
        [first_id, second_id]
    )
    status, limited = admin(gateway, "POST", "/admin/teams", {"name": "slow", "rpm": 2})
    third, _ = new_key(gateway, team_id=limited["id"])
    fourth, _ = new_key(gateway, team_id=limited["id"])
    ask(gateway, third)
    ask(gateway, fourth)
    with pytest.raises(openai.RateLimitError) as info:
        ask(gateway, third)
    assert info.value.code == "rate_limit_exceeded" and "team" in info.value.message
    status, body = admin(gateway, "POST", "/admin/keys", {"name": "x", "team_id": "team_none"})
    assert (status, body["error"]["param"]) == (400, "team_id")
    status, body = admin(gateway, "POST", "/admin/teams/update", {"id": limited["id"], "rpm": 5})
    assert (status, body["rpm"]) == (200, 5)


def test_a_budget_per_model(gateway: Gateway) -> None:
    key, _ = new_key(gateway, model_budgets={"chat": 1.0 * ANSWER}, budget_period="total")
    ask(gateway, key)
    with pytest.raises(openai.RateLimitError) as info:
        ask(gateway, key)
    assert "'chat'" in info.value.message
    ask(gateway, key, "other")  # no budget of its own
    status, body = admin(gateway, "POST", "/admin/keys", {"name": "x", "model_budgets": {"a": -1}})
    assert (status, body["error"]["param"]) == (400, "model_budgets")


def test_every_bad_field_is_named_and_a_key_names_only_served_models(gateway: Gateway) -> None:
    bad = {"name": "", "rpm": 0, "budget": -1, "models": ["chat", "nope"]}
    status, body = admin(gateway, "POST", "/admin/keys", bad)
    assert status == 400 and body["error"]["param"] == "name, rpm, budget, models", body
    message = body["error"]["message"]
    assert message.startswith("'name' must be a non-empty string. 'rpm' must be")
    assert message.endswith("'models' names a model the config does not serve: 'nope'.")
    key, key_id = new_key(gateway, models=["chat"])
    update = {"id": key_id, "models": ["other", "gone"], "tpm": -5}
    status, body = admin(gateway, "POST", "/admin/keys/update", update)
    assert status == 400 and body["error"]["param"] == "tpm, models", body
    ask(gateway, key)  # unchanged by the refused update

"""A key's model list holds for every model a request can reach (request fallbacks, group
fallbacks, context fallbacks, streamed or not), for the model list, and from the moment the
first key exists; the admin API answers bad numbers and strings with a 400 naming the field."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from ballast.sim.server import SimServer
from tests.e2e.test_access import MASTER, admin, client, new_key
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def _config(sim: SimServer, tmp_path: Path, master: bool = True) -> dict[str, Any]:
    return {
        "server": {"master_key": MASTER} if master else {},
        "state": sqlite_state(tmp_path),
        "models": [
            group("cheap", deployment("c", sim, model="sim-cheap")),
            group("expensive", deployment("e", sim, model="sim-expensive")),
            group("grouped", deployment("g", sim, model="sim-grouped"), fallbacks=["expensive"]),
            group(
                "small", deployment("s", sim, model="sim-small"), context_fallbacks=["expensive"]
            ),
        ],
    }


@pytest.fixture
def gateway(stack: Stack, sim: SimServer, tmp_path: Path) -> Gateway:
    return stack.gateway(_config(sim, tmp_path))


def _upstream_models(stack: Stack, sim: SimServer) -> list[str]:
    return [entry["model"] for entry in stack.attempts(sim)]


@pytest.mark.parametrize("stream", [False, True])
def test_request_fallback_outside_the_keys_models_is_never_served(
    stack: Stack, sim: SimServer, gateway: Gateway, stream: bool
) -> None:
    stack.set_behaviour(sim, "500", model="sim-cheap")
    limited, _ = new_key(gateway, models=["cheap"])
    stack.clear_log(sim)
    with pytest.raises(openai.APIStatusError) as info:
        reply = client(gateway, limited).chat.completions.create(
            model="cheap", messages=MESSAGES, stream=stream, extra_body={"fallbacks": ["expensive"]}
        )
        if stream:
            list(reply)
    assert "may not use" in info.value.message and "expensive" in info.value.message
    assert "sim-expensive" not in _upstream_models(stack, sim)
    # The same request from a key that may use both is answered by the fallback.
    both, _ = new_key(gateway, models=["cheap", "expensive"])
    reply = client(gateway, both).chat.completions.create(
        model="cheap", messages=MESSAGES, stream=stream, extra_body={"fallbacks": ["expensive"]}
    )
    if stream:
        assert list(reply)
    assert "sim-expensive" in _upstream_models(stack, sim)


def test_group_and_context_fallbacks_respect_the_keys_models(
    stack: Stack, sim: SimServer, gateway: Gateway
) -> None:
    stack.set_behaviour(sim, "500", model="sim-grouped")
    stack.set_behaviour(sim, "context_length", model="sim-small")
    limited, _ = new_key(gateway, models=["grouped", "small"])
    stack.clear_log(sim)
    with pytest.raises(openai.APIStatusError):
        client(gateway, limited).chat.completions.create(model="grouped", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client(gateway, limited).chat.completions.create(model="small", messages=MESSAGES)
    assert "sim-expensive" not in _upstream_models(stack, sim)
    everything, _ = new_key(gateway)
    assert client(gateway, everything).chat.completions.create(model="grouped", messages=MESSAGES)
    assert client(gateway, everything).chat.completions.create(model="small", messages=MESSAGES)
    assert _upstream_models(stack, sim).count("sim-expensive") == 2


def _get(gw: Gateway, path: str, key: str | None) -> tuple[int, Any]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(gw.url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_model_list_needs_a_key_and_shows_only_its_models(gateway: Gateway) -> None:
    assert _get(gateway, "/v1/models", None)[0] == 401
    key, _ = new_key(gateway, models=["cheap", "small"])
    listed = client(gateway, key).models.list()
    assert sorted(m.id for m in listed.data) == ["cheap", "small"]
    everything = client(gateway, MASTER).models.list()
    assert sorted(m.id for m in everything.data) == ["cheap", "expensive", "grouped", "small"]
    model = client(gateway, key).models.retrieve("cheap")
    assert (model.id, model.object, model.owned_by) == ("cheap", "model", "ballast")
    for hidden in ("expensive", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as info:
            client(gateway, key).models.retrieve(hidden)
        assert info.value.code == "model_not_found"
        assert info.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sk-bl-wrong").models.retrieve("cheap")


def test_the_first_key_closes_an_open_gateway_within_a_second(
    stack: Stack, sim: SimServer, tmp_path: Path
) -> None:
    config = _config(sim, tmp_path, master=False)
    first = stack.gateway(config)
    second = stack.gateway(config)  # another instance (or worker) on the same database
    anyone = client(first, "anything")
    assert anyone.chat.completions.create(model="cheap", messages=MESSAGES)
    assert _get(second, "/v1/models", None)[0] == 200
    # A key created through the first instance: the second sees it within a second.
    key, _ = stack.thread.run(first.app.state.keys.create(name="first"))
    with pytest.raises(openai.AuthenticationError):
        anyone.chat.completions.create(model="cheap", messages=MESSAGES)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and _get(second, "/v1/models", None)[0] == 200:
        time.sleep(0.05)
    assert _get(second, "/v1/models", None)[0] == 401
    with pytest.raises(openai.AuthenticationError):
        client(second, "anything").chat.completions.create(model="cheap", messages=MESSAGES)
    assert client(second, key).chat.completions.create(model="cheap", messages=MESSAGES)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rpm", 2**31),
        ("tpm", 2**63),
        ("max_parallel", 0),
        ("max_concurrent_jobs", True),
        ("budget", 1e300),
        ("budget", -1),
        ("expires_at", 1e20),
        ("name", "a\x00b"),
        ("name", "x" * 201),
        ("models", ["ok", "bad\x00"]),
        ("models", "cheap"),
        ("budget_period", "week"),
    ],
)
def test_admin_fields_out_of_range_get_a_400_naming_them(
    gateway: Gateway, field: str, value: Any
) -> None:
    status, body = admin(gateway, "POST", "/admin/keys", {"name": "k", field: value})
    assert status == 400, body
    assert body["error"]["param"] == field


def test_admin_ids_with_a_nul_get_a_400(gateway: Gateway) -> None:
    status, body = admin(gateway, "POST", "/admin/keys/revoke", {"id": "key_\x00"})
    assert (status, body["error"]["param"]) == (400, "id")
    status, body = admin(gateway, "GET", "/admin/keys/spend?id=key_%00")
    assert (status, body["error"]["param"]) == (400, "id")
    status, body = admin(gateway, "POST", "/admin/keys", {"name": "k", "rpm": 2**31 - 1})
    assert status == 201, body

"""Keys, allowlists and spend on `/v1/responses`, bridged and native: a responses request
is admitted like any other, and its input and output tokens and their cost are recorded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_access import MASTER, admin, new_key
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

INPUT, OUTPUT = 1.0, 1000.0  # dollars per token: the spend tells the two counts apart


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim()
    per_million = {"input": INPUT * 1e6, "output": OUTPUT * 1e6}
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": per_million},
            "models": [
                group("bridge", deployment("b", sim, model="sim-chat")),
                group("native", deployment("n", sim, model="sim-chat", responses="native")),
            ],
        }
    )


def api(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def spent(gateway: Gateway, key_id: str) -> float:
    spend: dict[str, Any] = {}
    for _ in range(100):
        status, spend = admin(gateway, "GET", f"/admin/keys/spend?id={key_id}")
        if status == 200 and spend["spend"] > 0:
            break
        time.sleep(0.05)
    return float(spend["spend"])


@pytest.mark.parametrize("model", ["bridge", "native"])
@pytest.mark.parametrize("stream", [False, True])
def test_tokens_and_cost_are_recorded(gateway: Gateway, model: str, stream: bool) -> None:
    key, key_id = new_key(gateway)
    client = api(gateway, key)
    if stream:
        with client.responses.stream(model=model, input="hello there") as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(model=model, input="hello there")  # type: ignore[assignment]
    usage = response.usage
    assert usage is not None and usage.output_tokens == 16 and usage.input_tokens >= 2
    expected = usage.input_tokens * INPUT + usage.output_tokens * OUTPUT
    assert spent(gateway, key_id) == pytest.approx(expected)


@pytest.mark.parametrize("model", ["bridge", "native"])
def test_keys_and_the_allowlist_apply(gateway: Gateway, model: str) -> None:
    with pytest.raises(openai.AuthenticationError) as unknown:
        api(gateway, "sk-bl-unknown").responses.create(model=model, input="x")
    assert unknown.value.code == "invalid_api_key"
    other = "native" if model == "bridge" else "bridge"
    key, _ = new_key(gateway, models=[other])
    with pytest.raises(openai.PermissionDeniedError) as denied:
        api(gateway, key).responses.create(model=model, input="x")
    assert denied.value.code == "model_not_allowed"
    assert api(gateway, key).responses.create(model=other, input="x").output_text

"""Prices through the gateway: an upstream that answers as a dated model name is priced by
its base name, and a deployment without a price shows in a gauge once a budget is set."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.test_access import MASTER, admin, client, new_key
from tests.stack import Stack, deployment, group, sqlite_state


def _config(sim: Any, tmp_path: Path) -> dict[str, Any]:
    return {
        "server": {"master_key": MASTER},
        "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
        "prices": {"echo": {"input": 1_000_000.0, "output": 1_000_000.0}},
        "models": [
            # The simulator answers as the model it was asked for: a dated name.
            group("chat", deployment("dated", sim, model="echo-2024-07-18")),
            group("free", deployment("unpriced", sim, model="no-price-known")),
        ],
    }


def test_a_dated_model_name_is_priced_and_unpriced_deployments_are_a_gauge(
    stack: Stack, tmp_path: Path
) -> None:
    sim = stack.sim("ok?tokens=3")
    first = stack.gateway(_config(sim, tmp_path))
    key, key_id = new_key(first, budget=1000.0, budget_period="total")
    reply = client(first, key).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.model == "echo-2024-07-18"
    assert reply.usage is not None
    expected = float(reply.usage.prompt_tokens + reply.usage.completion_tokens)
    deadline = time.monotonic() + 10
    while admin(first, "GET", f"/admin/keys/spend?id={key_id}")[1]["spend"] != expected:
        assert time.monotonic() < deadline, "never priced"
        time.sleep(0.1)
    # A gateway that starts while a key has a budget names what it cannot price.
    second = stack.gateway(_config(sim, tmp_path))
    request = urllib.request.Request(
        second.url + "/metrics", headers={"authorization": f"Bearer {MASTER}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    assert 'ballast_deployment_unpriced{deployment="unpriced"} 1.0' in text
    assert 'ballast_deployment_unpriced{deployment="dated"}' not in text

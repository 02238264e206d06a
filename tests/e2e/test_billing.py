"""Nothing is free: a stream the client drops before its end is billed for what it relayed
(the upstream's usage never came, so Ballast's estimate, marked as one), on every shape; a
budget reserves every choice a request asks for, at the dearest deployment it may reach."""

from __future__ import annotations

import http.client
import json
import signal
import sqlite3
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.sim.server import SimServer
from tests.e2e.test_access import MASTER, new_key
from tests.e2e.test_budget_concurrency import PRICES, admin_at, config, settled_spend
from tests.e2e.test_workers import workers
from tests.stack import (
    Gateway,
    Stack,
    deployment,
    free_port,
    group,
    serve,
    sqlite_state,
    wait_for,
)

HI = [{"role": "user", "content": "hi"}]
# (route, body, the deployment's own settings: how the shape is served)
SHAPES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": HI, "max_tokens": 200}, {}),
    "messages": ("/v1/messages", {"messages": HI, "max_tokens": 200}, {}),
    # Anthropic's own stream: its usage comes first, with one output token; the rest relayed
    # must be billed all the same.
    "messages-native": (
        "/v1/messages",
        {"messages": HI, "max_tokens": 200},
        {"provider": "anthropic", "messages": "native"},
    ),
    "responses-bridged": (
        "/v1/responses",
        {"input": "hi", "max_output_tokens": 200},
        {"responses": "bridge"},
    ),
    "responses-native": (
        "/v1/responses",
        {"input": "hi", "max_output_tokens": 200},
        {"responses": "native"},
    ),
}


def read_then_drop(port: int, key: str, path: str, body: dict[str, Any], events: int) -> None:
    """Ask for a stream, read its first `events` events, and close the socket."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    payload = json.dumps({"model": "chat", "stream": True, **body})
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    conn.request("POST", path, payload, headers)
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    seen = 0
    while seen < events:
        line = response.fp.readline()
        assert line, "the stream ended before the client dropped it"
        seen += line.startswith(b"data:")
    response.close()
    conn.close()


def spend_rows(folder: Path, key_id: str) -> list[tuple[int, int, float, int]]:
    """(prompt, completion, cost, estimated) of the key's spend events."""
    with sqlite3.connect(folder / "ballast.db") as db:
        query = (
            "SELECT prompt_tokens, completion_tokens, cost, estimated FROM spend_events"
            " WHERE key_id = ?"
        )
        return list(db.execute(query, (key_id,)))


@pytest.mark.sim(default="ok?tokens=200&delay=0.02")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_stream_the_client_drops_is_billed_for_what_it_relayed(
    stack: Stack, sim: SimServer, tmp_path: Path, shape: str
) -> None:
    path, body, extra = SHAPES[shape]
    settings = config(sim, sqlite_state(tmp_path, spend_flush_interval=0.1))
    entry = deployment("a", sim, model="sim-chat", **extra)
    if extra.get("provider") == "anthropic":
        entry["url"] = sim.url  # the API's root, where /v1/messages is
    settings["models"] = [group("chat", entry)]
    gateway = stack.gateway(settings)
    key, key_id = new_key(gateway, budget=1e6, budget_period="total")
    for _ in range(3):
        read_then_drop(gateway.port, key, path, body, events=10)
    # Output is $1 a token: each dropped stream costs at least the tokens read before the
    # client left, and less than the 200 of a whole answer.
    wait_for(lambda: len(spend_rows(tmp_path, key_id)) == 3)
    spend = settled_spend(gateway.url, key_id, 3 * 5)
    assert 3 * 5 <= spend < 3 * 200, spend
    rows = spend_rows(tmp_path, key_id)
    assert all(estimated for *_, estimated in rows), rows
    assert all(prompt > 0 and completion >= 5 for prompt, completion, *_ in rows), rows
    assert PRICES["sim-chat"]["input"] == 0.0  # so the cost is the completion's alone
    assert sum(cost for _, _, cost, _ in rows) == pytest.approx(spend)


@pytest.mark.sim(default="ok?tokens=200&delay=0.02")
def test_streams_dropped_on_two_workers_are_all_billed(
    stack: Stack, sim: SimServer, tmp_path: Path
) -> None:
    settings = config(sim, sqlite_state(tmp_path, spend_flush_interval=0.1))
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(settings))
    port = free_port()
    process = serve(path, port, workers=2, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(workers(process.pid)) == 2, timeout=30)
        wait_for(lambda: admin_at(url, "/health")[0] == 200, timeout=30)
        created = urllib.request.Request(
            url + "/admin/keys",
            data=json.dumps({"name": "w", "budget": 1e6, "budget_period": "total"}).encode(),
            headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(created, timeout=10) as response:
            made = json.loads(response.read())
        key, key_id = made["key"], made["id"]
        chat, body, _ = SHAPES["chat"]
        for _ in range(6):  # new connections: the kernel spreads them over both workers
            read_then_drop(port, key, chat, body, events=10)
        wait_for(lambda: len(spend_rows(tmp_path, key_id)) == 6)
        assert settled_spend(url, key_id, 6 * 5) >= 6 * 5
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]


def ask(gateway: Gateway, key: str, model: str, **extra: Any) -> int:
    body = json.dumps({"model": model, "messages": HI, **extra}).encode()
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        with error:
            assert error.code != 429 or b"insufficient_quota" in error.read()
            return error.code


def keyed(stack: Stack, tmp_path: Path, prices: dict[str, Any], *groups: Any) -> Gateway:
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": prices,
            "models": list(groups),
        }
    )


def test_every_choice_asked_for_is_reserved(stack: Stack, sim: SimServer, tmp_path: Path) -> None:
    # 100 tokens cost $0.003; 128 choices of them $0.384, 19x the budget.
    prices = {"sim-chat": {"input": 0.0, "output": 30.0}}
    gateway = keyed(stack, tmp_path, prices, group("chat", deployment("a", sim, "sim-chat")))
    key, _ = new_key(gateway, budget=0.02, budget_period="total")
    assert ask(gateway, key, "chat", n=128, max_tokens=100) == 429
    assert stack.attempts(sim) == []  # refused before it went upstream
    assert ask(gateway, key, "chat", n=1, max_tokens=100) == 200


def test_a_dearer_context_fallback_is_reserved_and_the_budget_holds(
    stack: Stack, tmp_path: Path
) -> None:
    small = stack.sim("context_length", name="small")
    large = stack.sim("ok?tokens=16", name="large")
    # The context fallback is 100x dearer: 50 tokens of it cost $0.01, the whole budget.
    prices = {"small-m": {"input": 0.0, "output": 2.0}, "large-m": {"input": 0.0, "output": 200.0}}
    gateway = keyed(
        stack,
        tmp_path,
        prices,
        group("chat", deployment("s", small, "small-m"), context_fallbacks=["large"]),
        group("large", deployment("l", large, "large-m")),
    )
    key, key_id = new_key(gateway, budget=0.01, budget_period="total")
    statuses = [ask(gateway, key, "chat", max_tokens=50) for _ in range(8)]
    assert statuses.count(200) >= 1 and 429 in statuses, statuses
    spend = settled_spend(gateway.url, key_id, 16 * 200.0 / 1e6)
    assert spend <= 0.01, (spend, statuses)

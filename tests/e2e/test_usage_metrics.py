"""Tokens and dollars an operator and a finance team can both read: after a known workload
the token, cost, cache and budget families hold exactly what the answers reported (summed
in the same order, so to the last bit), per model, deployment, provider, shape and key id;
and the request log says who spent what, with a stream the client abandoned logged as
`client_gone`, not `ok`."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import openai
import pytest

from ballast.observe.logs import JsonFormatter
from tests.e2e.test_access import MASTER, new_key
from tests.e2e.test_observe import scrape, value
from tests.stack import Gateway, Stack, deployment, group, sqlite_state, wait_for

MESSAGES: list[Any] = [{"role": "user", "content": "how much does this cost"}]
PRICE_IN, PRICE_OUT = 3.0, 15.0  # dollars per million tokens


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim()
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": {"input": PRICE_IN, "output": PRICE_OUT}},
            "models": [
                group("chat", deployment("a", sim, model="sim-chat")),
                group("free", deployment("b", sim), cache={"ttl": 60}),
            ],
        }
    )


def _client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)


def _cost(prompt: int, completion: int) -> float:
    return (prompt * PRICE_IN + completion * PRICE_OUT) / 1_000_000


def test_tokens_cost_and_cache_after_a_known_workload(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    alice, alice_id = new_key(gateway, budget=1.0, budget_period="total")
    bob, bob_id = new_key(gateway)
    expected: dict[str, list[float]] = {alice_id: [0, 0, 0.0], bob_id: [0, 0, 0.0]}
    for _ in range(3):
        reply = _client(gateway, alice).chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.usage is not None
        row = expected[alice_id]
        row[0] += reply.usage.prompt_tokens
        row[1] += reply.usage.completion_tokens
        row[2] += _cost(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    for _ in range(2):
        stream = _client(gateway, bob).chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = next(c.usage for c in stream if c.usage is not None)
        row = expected[bob_id]
        row[0] += usage.prompt_tokens
        row[1] += usage.completion_tokens
        row[2] += _cost(usage.prompt_tokens, usage.completion_tokens)
    for _ in range(2):  # a miss, then a hit: no upstream tokens for the hit
        _client(gateway, bob).chat.completions.create(model="free", messages=MESSAGES)

    samples = scrape(gateway)
    labels = {"model": "chat", "deployment": "a", "provider": "openai", "shape": "openai"}
    for key_id, (prompt, completion, cost) in expected.items():
        got_in = value(samples, "ballast_tokens_total", key_id=key_id, type="input", **labels)
        got_out = value(samples, "ballast_tokens_total", key_id=key_id, type="output", **labels)
        assert (got_in, got_out) == (prompt, completion)
        assert value(samples, "ballast_cost_dollars_total", key_id=key_id, **labels) == cost
    total_in = expected[alice_id][0] + expected[bob_id][0]
    assert (
        value(
            samples,
            "gen_ai_client_token_usage_sum",
            gen_ai_token_type="input",
            gen_ai_request_model="chat",
        )
        == total_in
    )
    assert value(samples, "gen_ai_client_token_usage_count", gen_ai_request_model="chat") == 10
    assert value(samples, "ballast_cache_requests_total", model="free", result="miss") == 1
    assert value(samples, "ballast_cache_requests_total", model="free", result="hit") == 1
    assert value(samples, "ballast_cost_dollars_total", model="free") == 0.0  # unpriced
    # Alice's budget: one dollar less what she spent, as the budget check knew it at her
    # last request (its shared figure may lag a flush by up to a second).
    left = value(samples, "ballast_key_budget_remaining_dollars", key_id=alice_id)
    assert 1.0 - expected[alice_id][2] - 1e-9 <= left < 1.0
    assert value(samples, "gen_ai_client_operation_duration_seconds_count") >= 7
    assert "ballast_tokens_total" in samples and not any(
        MASTER in str(labels) for labels, _ in samples["ballast_tokens_total"]
    )

    lines = [
        json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "ballast.access"
    ]
    priced = [line for line in lines if line.get("key_id") == alice_id]
    assert len(priced) == 3
    first = priced[0]
    assert first["model_asked"] == "chat" and first["model_answered"] == "sim-chat"
    assert first["provider"] == "openai" and first["deployment"] == "a"
    assert first["outcome"] == "ok" and first["attempts"] == 1
    assert first["upstream_request_id"].startswith("req_")
    assert first["request_id"] and first["cache"] is None
    assert sum(line["cost"] for line in priced) == expected[alice_id][2]
    cached = [line for line in lines if line.get("model") == "free"]
    assert [line["cache"] for line in cached] == ["miss", "hit"]


def test_per_key_metrics_can_be_switched_off(stack: Stack, tmp_path: Path) -> None:
    sim = stack.sim()
    gw = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
            "observe": {"per_key_metrics": False},
            "models": [group("chat", deployment("a", sim))],
        }
    )
    key, _ = new_key(gw)
    _client(gw, key).chat.completions.create(model="chat", messages=MESSAGES)
    samples = scrape(gw)
    assert {labels["key_id"] for labels, _ in samples["ballast_tokens_total"]} == {"all"}


def test_an_abandoned_stream_is_logged_as_client_gone(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    sim = stack.sim("ok?tokens=200&delay=0.05")
    gateway = stack.gateway(
        {"server": {"master_key": MASTER}, "models": [group("chat", deployment("a", sim))]}
    )
    body = json.dumps({"model": "chat", "messages": MESSAGES, "stream": True}).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {MASTER}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = b""
        while b"data:" not in head:  # the stream started
            head += sock.recv(65536)
    rid = head.split(b"x-request-id: ", 1)[1].split(b"\r\n", 1)[0].decode()

    def logged() -> list[dict[str, Any]]:
        lines = [JsonFormatter().format(r) for r in caplog.records if r.name == "ballast.access"]
        return [line for line in map(json.loads, lines) if line["request_id"] == rid]

    wait_for(logged, timeout=15)
    line = logged()[0]
    assert line["outcome"] == "client_gone" and line["status"] == 200

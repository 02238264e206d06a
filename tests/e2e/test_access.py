"""Keys, allowlists, budgets, rate limits and spend through the gateway (embedded SQLite)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from ballast.state.ratelimit import reset_header
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MASTER = "sk-master-for-tests-0123456789"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def admin(gw: Gateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        gw.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim()
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": {"input": 1_000_000, "output": 1_000_000}},  # $1 per token
            "models": [
                group("chat", deployment("a", sim, model="sim-chat")),
                group("other", deployment("b", sim)),
            ],
        }
    )


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def new_key(gw: Gateway, **options: Any) -> tuple[str, str]:
    status, body = admin(gw, "POST", "/admin/keys", {"name": "test", **options})
    assert status == 201, body
    return body["key"], body["id"]


def test_missing_unknown_revoked_and_expired_keys_get_401(gateway: Gateway) -> None:
    anonymous = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=json.dumps({"model": "chat", "messages": MESSAGES}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(anonymous, timeout=5)
    assert missing.value.code == 401
    assert json.loads(missing.value.read())["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError) as info:
        client(gateway, "sk-bl-unknown").chat.completions.create(model="chat", messages=MESSAGES)
    assert info.value.code == "invalid_api_key"
    key, key_id = new_key(gateway)
    assert client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    assert admin(gateway, "POST", "/admin/keys/revoke", {"id": key_id})[0] == 200
    with pytest.raises(openai.AuthenticationError):
        client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    expired, _ = new_key(gateway, expires_at=time.time() - 1)
    with pytest.raises(openai.AuthenticationError):
        client(gateway, expired).chat.completions.create(model="chat", messages=MESSAGES)


def test_master_key_and_admin_require_it(gateway: Gateway) -> None:
    assert client(gateway, MASTER).chat.completions.create(model="chat", messages=MESSAGES)
    request = urllib.request.Request(gateway.url + "/admin/keys", method="GET")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5)
    assert info.value.code == 401


def test_model_allowlist_gives_403(gateway: Gateway) -> None:
    key, _ = new_key(gateway, models=["chat"])
    assert client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.PermissionDeniedError) as info:
        client(gateway, key).chat.completions.create(model="other", messages=MESSAGES)
    assert info.value.code == "model_not_allowed"


def test_rpm_limit_answers_429_with_headers(gateway: Gateway) -> None:
    key, _ = new_key(gateway, rpm=2)
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES
    )
    assert raw.headers.get("x-ratelimit-limit-requests") == "2"
    client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as info:
        client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    assert info.value.code == "rate_limit_exceeded"
    headers = info.value.response.headers
    wait = int(headers["retry-after"])
    assert 1 <= wait <= 120
    # The wait is said once, three ways that agree: the message, Retry-After and the reset.
    assert headers["x-ratelimit-reset-requests"] == reset_header(wait).decode()
    body: Any = info.value.body
    assert body["message"] == (
        f"Rate limit reached for requests on this key: 2 requests per minute. Retry in {wait} s."
    )


def test_spend_is_recorded_and_budget_enforced(gateway: Gateway) -> None:
    # $1 per token: each request reserves about 32 (its prompt estimate + 16) and costs 17.
    key, key_id = new_key(gateway, budget=60.0, budget_period="total")
    chat = client(gateway, key).chat.completions
    reply = chat.create(model="chat", messages=MESSAGES, max_tokens=16)
    assert reply.usage is not None
    expected = float(reply.usage.prompt_tokens + reply.usage.completion_tokens)  # $1 per token
    spend: dict[str, Any] = {}
    for _ in range(50):
        status, spend = admin(gateway, "GET", f"/admin/keys/spend?id={key_id}")
        if status == 200 and spend["spend"] > 0:
            break
        time.sleep(0.05)
    assert spend["spend"] == pytest.approx(expected)
    chat.create(model="chat", messages=MESSAGES, max_tokens=16)  # 34 spent, 26 left
    with pytest.raises(openai.RateLimitError) as info:
        chat.create(model="chat", messages=MESSAGES, max_tokens=16)
    assert info.value.code == "insufficient_quota"
    # Without max_tokens the worst case is the model's longest answer: never fits here.
    other, _ = new_key(gateway, budget=60.0, budget_period="total")
    with pytest.raises(openai.RateLimitError):
        client(gateway, other).chat.completions.create(model="chat", messages=MESSAGES)


def test_stream_usage_is_accounted_but_stripped_unless_asked(gateway: Gateway) -> None:
    key, key_id = new_key(gateway)
    stream = client(gateway, key).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True
    )
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    spend: dict[str, Any] = {}
    for _ in range(50):
        status, spend = admin(gateway, "GET", f"/admin/keys/spend?id={key_id}")
        if status == 200 and spend["spend"] > 0:
            break
        time.sleep(0.05)
    assert spend["spend"] == pytest.approx(17.0)  # 1 prompt word + 16 tokens, $1 each
    asked = client(gateway, key).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert any(c.usage is not None for c in asked)


def test_keys_never_appear_in_clear(
    gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key, key_id = new_key(gateway, models=["chat"])
    client(gateway, key).chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.PermissionDeniedError) as info:
        client(gateway, key).chat.completions.create(model="other", messages=MESSAGES)
    assert key not in str(info.value.body)
    assert key not in caplog.text and MASTER not in caplog.text
    assert key.encode() not in (tmp_path / "ballast.db").read_bytes()
    status, listed = admin(gateway, "GET", "/admin/keys")
    assert status == 200 and key not in json.dumps(listed)
    assert any(k["id"] == key_id for k in listed["data"])

"""Hedged first token: a slow first token on one deployment starts the same request on a
second one; the first to produce a token wins and the loser is cancelled."""

from __future__ import annotations

import time
from typing import Any

import openai

from tests.stack import Stack, deployment, group

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def test_slow_first_token_is_hedged_on_another_deployment(stack: Stack) -> None:
    slow = stack.sim("slow_first?delay=3")
    fast = stack.sim("ok")
    gw = stack.gateway(
        {
            "routing": {"hedge_after": 0.1},
            "models": [
                group("m", deployment("slow", slow), deployment("fast", fast), strategy="ordered")
            ],
        }
    )
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-client", max_retries=0)
    started = time.monotonic()
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    first_token_at = None
    text = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_token_at = first_token_at or time.monotonic() - started
            text += chunk.choices[0].delta.content
    assert text == "".join(f"tok{i} " for i in range(16))
    assert first_token_at is not None and first_token_at < 1.0
    assert len(stack.attempts(fast)) == 1
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the loser's request is dropped, not left running
        attempts = stack.attempts(slow)
        if attempts and attempts[0].get("disconnected"):
            break
        time.sleep(0.05)
    assert stack.attempts(slow)[0].get("disconnected") is True


def test_hedging_is_off_by_default(stack: Stack) -> None:
    slow = stack.sim("slow_first?delay=0.6")
    fast = stack.sim("ok")
    gw = stack.gateway(
        {
            "models": [
                group("m", deployment("slow", slow), deployment("fast", fast), strategy="ordered")
            ]
        }
    )
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-client", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert stack.attempts(fast) == []

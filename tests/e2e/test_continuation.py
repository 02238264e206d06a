"""Continuation that knows its limits, through the official SDKs: a continuation never
prefills a model or mode that refuses a prefill."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from ballast.sim.server import SimServer
from tests.e2e.test_routing import MESSAGES, client, config, full, ordered
from tests.stack import Gateway, Stack, deployment

TOOLS: Any = [{"name": "lookup", "input_schema": {"type": "object"}}]
HI: Any = [{"role": "user", "content": "hi"}]


def streamed_text(api: openai.OpenAI, **kw: Any) -> str:
    chunks = api.chat.completions.create(model="chat", messages=MESSAGES, stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def claude(dep_id: str, sim: SimServer, **extra: Any) -> dict[str, Any]:
    """A deployment speaking Messages (natively to Messages clients, translated for chat)."""
    entry = deployment(dep_id, sim, model="claude-sim", provider="anthropic", **extra)
    return {**entry, "url": sim.url}


def messages_api(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="sk-client", max_retries=0, timeout=20)


# -- models and modes that refuse a prefill ----------------------------------------------


@pytest.mark.parametrize(
    ("b_of", "extra"),
    [
        (lambda b: claude("b", b, supports_prefill=False), {}),  # the model refuses one
        (
            lambda b: claude("b", b),
            {"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 1024}}},
        ),
        (
            lambda b: deployment("b", b, provider="vllm", supports_prefill=True),
            {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
        ),
    ],
    ids=["supports_prefill-false", "extended-thinking", "enable_thinking"],
)
def test_a_deployment_or_mode_that_refuses_a_prefill_regenerates(
    stack: Stack, b_of: Any, extra: dict[str, Any]
) -> None:
    a = stack.sim("cut?after=20&tokens=60", name="a")
    b = stack.sim("ok?tokens=60", name="b")  # strict: a prefill with thinking on is a 400
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), b_of(b))))
    assert streamed_text(client(gateway), **extra) == full(60)
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is False and continued["outcome"] == "ok"

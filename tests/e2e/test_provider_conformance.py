"""One suite, every provider: the same client-visible behaviour through the official openai
SDK whichever wire the deployments speak (each on the simulator speaking that wire):
answers and streams with usage, tool calls, a rate limit failed over, a cut stream
continued into one whole answer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import FAST, full
from tests.stack import Stack, group

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
]


def _openai(dep_id: str, url: str) -> dict[str, Any]:
    return {"id": dep_id, "url": url + "/v1", "api_key": "sk-x", "model": "m"}


def _anthropic(dep_id: str, url: str) -> dict[str, Any]:
    return {**_openai(dep_id, url), "provider": "anthropic"}


def _azure(dep_id: str, url: str) -> dict[str, Any]:
    options = {"api_version": "2024-10-21"}
    return {**_openai(dep_id, url), "url": url, "provider": "azure", "azure": options}


def _azure_v1(dep_id: str, url: str) -> dict[str, Any]:
    return {**_azure(dep_id, url), "azure": {"style": "v1"}}


def _preset(dep_id: str, url: str) -> dict[str, Any]:
    return {**_openai(dep_id, url), "provider": "groq"}


PROVIDERS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "azure": _azure,
    "azure-v1": _azure_v1,
    "groq": _preset,
}


@pytest.fixture(params=list(PROVIDERS))
def make(request: pytest.FixtureRequest) -> Callable[[str, str], dict[str, Any]]:
    maker: Callable[[str, str], dict[str, Any]] = PROVIDERS[request.param]
    return maker


def api_for(stack: Stack, *deployments: dict[str, Any]) -> openai.OpenAI:
    config = {"timeouts": FAST, "models": [group("chat", *deployments, strategy="ordered")]}
    gateway = stack.gateway(config)
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)


def streamed(api: openai.OpenAI, **kw: Any) -> tuple[str, str | None, Any]:
    text, finish, usage = "", None, None
    for chunk in api.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    return text, finish, usage


def test_answers_and_streams(stack: Stack, make: Callable[[str, str], dict[str, Any]]) -> None:
    api = api_for(stack, make("a", stack.sim().url))
    reply = api.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5)
    assert reply.choices[0].message.content == full(5)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    text, finish, usage = streamed(api)
    assert text == full(16) and finish == "stop"
    assert usage is not None and usage.completion_tokens == 16


def test_tool_calls(stack: Stack, make: Callable[[str, str], dict[str, Any]]) -> None:
    api = api_for(stack, make("a", stack.sim("ok?shape=tool&tokens=2").url))
    reply = api.chat.completions.create(model="chat", messages=MESSAGES, tools=TOOLS)
    (call,) = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls"
    assert json.loads(call.function.arguments) == {"q": "tok0 tok1 "}  # type: ignore[union-attr]
    arguments = ""
    for chunk in api.chat.completions.create(
        model="chat", messages=MESSAGES, tools=TOOLS, stream=True
    ):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments += (delta.function.arguments if delta.function else None) or ""
    assert json.loads(arguments) == {"q": "tok0 tok1 "}


def test_a_rate_limit_fails_over(stack: Stack, make: Callable[[str, str], dict[str, Any]]) -> None:
    limited, good = stack.sim("429?retry_after=30"), stack.sim()
    api = api_for(stack, make("limited", limited.url), make("good", good.url))
    for _ in range(2):
        assert api.chat.completions.create(model="chat", messages=MESSAGES).choices
    assert len(stack.attempts(limited)) == 1  # cooled down for its Retry-After


def test_a_cut_stream_is_continued(
    stack: Stack, make: Callable[[str, str], dict[str, Any]]
) -> None:
    cut, whole = stack.sim("cut?after=20&tokens=60"), stack.sim("ok?tokens=60")
    api = api_for(stack, make("cut", cut.url), make("whole", whole.url))
    text, finish, usage = streamed(api)
    assert text == full(60) and finish == "stop" and usage is not None

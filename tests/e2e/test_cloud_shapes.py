"""Gemini and Bedrock deployments behind Ballast's other API shapes: the Anthropic Messages
API through the official `anthropic` SDK and the Responses API through `openai`, streamed and
not, with a tool call, each answered by the simulator speaking the provider's own wire."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from ballast.sim.answer import full_text
from ballast.sim.server import SimServer
from tests.e2e.test_cloud_providers import BEDROCK, GEMINI, _bedrock, _gemini
from tests.stack import Gateway, Stack, group

TOOL_MESSAGES: list[Any] = [
    {"name": "lookup", "description": "Look a word up.",
     "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
]  # fmt: skip
TOOL_RESPONSES: list[Any] = [
    {"type": "function", "name": "lookup", "description": "Look a word up.",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
]  # fmt: skip


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSHAPES")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "shapes-secret")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["gemini", "bedrock"])
def served(
    request: pytest.FixtureRequest, stack: Stack, aws: None
) -> Iterator[tuple[Stack, SimServer, Gateway, str]]:
    sim = stack.sim("ok?tokens=6")
    native = _gemini(sim) if request.param == "gemini" else _bedrock(sim)
    model = GEMINI if request.param == "gemini" else BEDROCK
    yield stack, sim, stack.gateway({"models": [group("cloud", native)]}), model


def test_messages_shape(served: tuple[Stack, SimServer, Gateway, str]) -> None:
    stack, sim, gateway, model = served
    api = anthropic.Anthropic(base_url=gateway.url, api_key="sk-client", max_retries=0, timeout=20)
    hi: list[Any] = [{"role": "user", "content": "hello there"}]
    message = api.messages.create(model="cloud", max_tokens=100, messages=hi, system="be brief")
    assert message.content[0].type == "text" and message.content[0].text == full_text(6)
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 6
    with api.messages.stream(model="cloud", max_tokens=100, messages=hi) as stream:
        assert "".join(stream.text_stream) == full_text(6)
    stack.set_behaviour(sim, "ok?tokens=2&shape=tool", model)
    called = api.messages.create(model="cloud", max_tokens=100, messages=hi, tools=TOOL_MESSAGES)
    (use,) = [b for b in called.content if b.type == "tool_use"]
    assert use.name == "lookup" and use.input == {"q": full_text(2)}
    assert called.stop_reason == "tool_use"


def test_responses_shape(served: tuple[Stack, SimServer, Gateway, str]) -> None:
    stack, sim, gateway, model = served
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)
    response = api.responses.create(model="cloud", input="hello there", instructions="be brief")
    assert response.output_text == full_text(6) and response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens == 6
    with api.responses.stream(model="cloud", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(deltas) == full_text(6)
    stack.set_behaviour(sim, "ok?tokens=2&shape=tool", model)
    called = api.responses.create(model="cloud", input="look it up", tools=TOOL_RESPONSES)
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "lookup" and json.loads(call.arguments) == {"q": full_text(2)}

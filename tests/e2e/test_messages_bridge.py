"""Messages bridged through chat to providers that carry more than chat does, with the
official `anthropic` SDK against the simulator's strict wires: `cache_control` marks reach an
Anthropic deployment where the client put them and become Bedrock `cachePoint` blocks (the
simulator writes the marked prefix to its cache, then reads it), a tool loop with thinking
on goes round with each turn's signed thinking sent back exactly (the simulator refuses a
tool turn without it), streamed and whole, and the client sees the exact signature. A chat
upstream gets neither, and the client is told; a group mixing them fails over without
losing the marks where the deployment that answers carries them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from ballast.sim.agent import THINKING_TEXT, sign
from ballast.sim.server import SimServer
from tests.e2e.test_cloud_providers import BEDROCK
from tests.e2e.test_cloud_providers import aws_env as aws_env
from tests.e2e.test_messages_native import MASTER, THINKING, anthropic_dep, api
from tests.stack import Gateway, Stack, deployment, group

MARK: Any = {"type": "ephemeral"}
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
TOOLS: Any = [{"name": "echo", "input_schema": SCHEMA, "cache_control": MARK}]
SYSTEM: Any = [{"type": "text", "text": "rule " * 40, "cache_control": MARK}]
# The first block is marked: the cached prefix is the system's 40 words and its 10.
ASK: Any = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "word " * 10, "cache_control": MARK},
            {"type": "text", "text": "what now"},
        ],
    }
]
CACHED = 50


def bridged(dep_id: str, sim: SimServer) -> dict[str, Any]:
    return anthropic_dep(dep_id, sim, messages="bridge")


def one_group(stack: Stack, *deployments: dict[str, Any], **extra: Any) -> Gateway:
    models = [group("claude", *deployments, **extra)]
    return stack.gateway({"server": {"master_key": MASTER}, "models": models})


def ask(gateway: Gateway, stream: bool, **fields: Any) -> tuple[Any, dict[str, str]]:
    """(the Message, the response's headers), streamed or whole."""
    client = api(gateway)
    if stream:
        with client.messages.stream(**fields) as events:
            return events.get_final_message(), dict(events.response.headers)
    raw = client.messages.with_raw_response.create(**fields)
    return raw.parse(), dict(raw.headers)


def test_cache_marks_reach_a_bridged_anthropic_deployment_where_they_were(stack: Stack) -> None:
    sim = stack.sim("ok?tokens=3", name="claude")
    gateway = one_group(stack, bridged("a", sim))
    asked: Any = {"model": "claude", "max_tokens": 50, "tools": TOOLS, "system": SYSTEM}
    first, headers = ask(gateway, False, messages=ASK, **asked)
    assert "x-ballast-dropped" not in headers
    assert first.usage.cache_creation_input_tokens == CACHED
    assert not first.usage.cache_read_input_tokens
    assert first.usage.input_tokens == 2  # "what now": neither read nor written
    second, _ = ask(gateway, True, messages=ASK, **asked)
    assert second.usage.cache_read_input_tokens == CACHED
    assert not second.usage.cache_creation_input_tokens
    assert second.content[0].type == "text" and second.content[0].text == "tok0 tok1 tok2 "
    attempts = stack.attempts(sim)
    assert [a["outcome"] for a in attempts] == ["ok", "ok"]
    for attempt in attempts:
        assert attempt["path"] == "/v1/messages"  # bridged: the chat form, translated back
        assert attempt["cache_marks"] == ["tools.0", "system.0", "messages.0.content.0"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_with_thinking_goes_round_with_each_signature_exactly(
    stack: Stack, stream: bool
) -> None:
    sim = stack.sim("ok?shape=agent&tool=echo&arg=hi&calls=2&tokens=2", name="claude")
    gateway = one_group(stack, bridged("a", sim))
    tools: Any = [{"name": "echo", "input_schema": SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": "echo it twice"}]
    stops = []
    for number in range(3):
        message, headers = ask(
            gateway, stream, model="claude", max_tokens=64, tools=tools, messages=messages,
            thinking=THINKING,
        )  # fmt: skip
        assert "x-ballast-dropped" not in headers
        thinking = message.content[0]
        assert thinking.type == "thinking" and thinking.thinking == THINKING_TEXT
        assert thinking.signature == sign(THINKING_TEXT)
        stops.append(message.stop_reason)
        if message.stop_reason != "tool_use":
            break
        use = message.content[-1]
        assert use.type == "tool_use" and use.input == {"text": "hi"}
        messages.append({"role": "assistant", "content": message.content})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": f"hi {number}"}
        messages.append({"role": "user", "content": [result]})
    assert stops == ["tool_use", "tool_use", "end_turn"]
    attempts = stack.attempts(sim)
    assert [a["outcome"] for a in attempts] == ["ok", "ok", "ok"]
    assert [a["tool_results"] for a in attempts] == [[], ["hi 0"], ["hi 0", "hi 1"]]
    assert all("thinking" in a["fields"] for a in attempts)
    # A signature altered on the way would be refused: the blocks really go back upstream.
    forged = {"type": "thinking", "thinking": THINKING_TEXT, "signature": "forged"}
    messages[1] = {"role": "assistant", "content": [forged, messages[1]["content"][-1]]}
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        api(gateway).messages.create(
            model="claude", max_tokens=64, tools=tools, messages=messages, thinking=THINKING
        )


@pytest.fixture
def bedrock(stack: Stack, aws_env: None) -> Iterator[SimServer]:
    yield stack.sim("ok?tokens=3", name="bedrock")


def test_cache_marks_are_cache_points_on_bedrock_and_thinking_is_named(
    stack: Stack, bedrock: SimServer
) -> None:
    entry = {"id": "bed", "url": bedrock.url, "model": BEDROCK, "provider": "bedrock"}
    gateway = one_group(stack, {**entry, "aws": {"region": "us-east-1"}})
    asked: Any = {"model": "claude", "max_tokens": 50, "tools": TOOLS, "system": SYSTEM}
    first, headers = ask(gateway, True, messages=ASK, thinking=THINKING, **asked)
    assert headers["x-ballast-dropped"] == "thinking"  # Converse is not sent it
    assert first.usage.cache_creation_input_tokens == CACHED
    second, _ = ask(gateway, False, messages=ASK, thinking=THINKING, **asked)
    assert second.usage.cache_read_input_tokens == CACHED
    assert second.usage.input_tokens == 2
    assert second.content[0].type == "text" and second.content[0].text == "tok0 tok1 tok2 "
    attempts = stack.attempts(bedrock)
    points = ["toolConfig.tools.1", "system.1", "messages.0.content.1"]  # each after its block
    assert [a["cache_marks"] for a in attempts] == [points, points]


def test_a_chat_upstream_gets_neither_and_the_client_is_told(stack: Stack) -> None:
    chat = stack.sim("ok?tokens=2", name="chat")
    gateway = one_group(stack, deployment("b", chat, model="sim-chat"))
    history: Any = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": THINKING_TEXT, "signature": sign(THINKING_TEXT)},
                {"type": "redacted_thinking", "data": "c2VjcmV0"},
                {"type": "text", "text": "noted"},
            ],
        },
        {"role": "user", "content": "go on"},
    ]
    message, headers = ask(
        gateway, False, model="claude", max_tokens=20, system=SYSTEM, tools=TOOLS,
        messages=history, thinking=THINKING,
    )  # fmt: skip
    assert headers["x-ballast-dropped"] == "cache_control,thinking,redacted_thinking"
    assert message.content[0].type == "text" and message.content[0].text == "tok0 tok1 "
    assert [a["outcome"] for a in stack.attempts(chat)] == ["ok"]


@pytest.mark.parametrize("down", ["anthropic", "chat"])
def test_a_group_mixing_them_sends_each_deployment_what_it_carries(stack: Stack, down: str) -> None:
    claude = stack.sim("500" if down == "anthropic" else "ok?tokens=2", name="claude")
    chat = stack.sim("500" if down == "chat" else "ok?tokens=2", name="chat")
    first, then = bridged("a", claude), deployment("b", chat, model="sim-chat")
    if down == "chat":
        first, then = then, first
    gateway = one_group(stack, first, then, strategy="ordered")
    message, headers = ask(
        gateway, True, model="claude", max_tokens=20, system=SYSTEM, tools=TOOLS, messages=ASK,
        thinking=THINKING,
    )  # fmt: skip
    # Told before the answer is known: the chat deployment of the group would drop them.
    assert headers["x-ballast-dropped"] == "cache_control,thinking"
    assert message.content[-1].type == "text" and message.content[-1].text == "tok0 tok1 "
    answered = stack.attempts(claude)
    if down == "chat":  # the Anthropic deployment answered, with every mark and its thinking
        assert answered[-1]["cache_marks"] == ["tools.0", "system.0", "messages.0.content.0"]
        assert "thinking" in answered[-1]["fields"]
        assert message.content[0].signature == sign(THINKING_TEXT)
    else:
        assert [a["outcome"] for a in stack.attempts(chat)] == ["ok"]

"""The simulator's Anthropic wire, read by the official `anthropic` SDK: if the SDK cannot
parse what it sends, the simulator is wrong."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.stack import Stack

TEXT = "".join(f"tok{i} " for i in range(16))


@pytest.fixture
def client(stack: Stack) -> anthropic.Anthropic:
    sim = stack.sim()
    return anthropic.Anthropic(base_url=sim.url, api_key="sk-ant-test", max_retries=0)


def test_text_whole_and_streamed(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude-sim",
        max_tokens=64,
        system="be brief",
        messages=[{"role": "user", "content": "hello"}],
    )
    assert message.content[0].type == "text" and message.content[0].text == TEXT
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 16
    with client.messages.stream(
        model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == TEXT and final.usage.output_tokens == 16 and final.stop_reason == "end_turn"


def test_tools_whole_and_streamed(client: anthropic.Anthropic) -> None:
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    headers = {"x-sim-behaviour": "ok?shape=tool&tokens=3"}
    message = client.messages.create(
        model="claude-sim",
        max_tokens=64,
        tools=tools,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "look it up"}],
        extra_headers=headers,
    )
    block = message.content[0]
    assert block.type == "tool_use" and block.name == "lookup"
    assert block.input == {"q": "tok0 tok1 tok2 "} and message.stop_reason == "tool_use"
    with client.messages.stream(
        model="claude-sim",
        max_tokens=64,
        tools=tools,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "look it up"}],
        extra_headers=headers,
    ) as stream:
        final = stream.get_final_message()
    streamed = final.content[0]
    assert streamed.type == "tool_use" and streamed.input == {"q": "tok0 tok1 tok2 "}


def test_errors_are_anthropic_errors(client: anthropic.Anthropic) -> None:
    ask = {"model": "claude-sim", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(**ask, extra_headers={"x-sim-behaviour": "429?retry_after=1"})  # type: ignore[call-overload]
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        client.messages.create(**ask, extra_headers={"x-sim-behaviour": "503"})  # type: ignore[call-overload]
    assert overloaded.value.status_code == 529
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(**ask, extra_headers={"x-sim-behaviour": "context_length"})  # type: ignore[call-overload]


def test_a_prefill_is_continued(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude-sim",
        max_tokens=64,
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "tok0 tok1"},
        ],
    )
    assert message.content[0].type == "text"
    assert "tok1 " + message.content[0].text.lstrip() == TEXT[len("tok0 ") :]


def test_with_thinking_on_a_prefill_is_refused_as_anthropic_refuses_it(
    client: anthropic.Anthropic,
) -> None:
    prefill: Any = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "tok0 tok1"},
    ]
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(
                model="claude-sim",
                max_tokens=64,
                messages=prefill,
                thinking=thinking,
                stream=stream,
            )
        assert "must start with a thinking block" in info.value.message
    # The same conversation without the prefill, or without thinking, is answered.
    answered = client.messages.create(
        model="claude-sim", max_tokens=64, messages=prefill[:1], thinking=thinking
    )
    assert [block.type for block in answered.content] == ["thinking", "text"]
    assert client.messages.create(model="claude-sim", max_tokens=64, messages=prefill).content


def test_an_error_event_mid_stream_is_an_sdk_error(client: anthropic.Anthropic) -> None:
    text = ""
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        with client.messages.stream(
            model="claude-sim",
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-behaviour": "error_event?after=3"},
        ) as stream:
            for piece in stream.text_stream:
                text += piece
    assert text == "tok0 tok1 tok2 "


def test_the_agent_calls_its_tool_as_often_as_asked_and_logs_what_came_back(
    stack: Stack,
) -> None:
    sim = stack.sim("ok?shape=agent&tool=echo&arg=hi&calls=2&tokens=2")
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tools: Any = [{"name": "echo", "input_schema": schema}]
    messages: list[Any] = [{"role": "user", "content": "echo it twice"}]
    stops = []
    with anthropic.Anthropic(base_url=sim.url, api_key="sk-ant-test", max_retries=0) as client:
        for number in range(3):
            message = client.messages.create(
                model="claude-sim", max_tokens=64, tools=tools, messages=messages
            )
            stops.append(message.stop_reason)
            if message.stop_reason != "tool_use":
                break
            use = message.content[-1]
            assert use.type == "tool_use" and use.input == {"text": "hi"}
            messages.append({"role": "assistant", "content": message.content})
            result = {"type": "tool_result", "tool_use_id": use.id, "content": f"hi {number}"}
            messages.append({"role": "user", "content": [result]})
    assert stops == ["tool_use", "tool_use", "end_turn"]
    logged = [a["tool_results"] for a in stack.attempts(sim)]
    assert logged == [[], ["hi 0"], ["hi 0", "hi 1"]]

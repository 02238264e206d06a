"""Continuation that knows its limits, through the official SDKs: a continuation goes on from
exactly what the client has (even when the one before it broke too), never prefills a model
or mode that refuses a prefill, never splices into a tool call (a regenerated call must say
the client's arguments again, character for character, before anything new), and a native
stream, which nothing continues, ends with its own shape's error event, never a clean end."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from ballast.sim.server import SimServer
from tests.e2e.test_agents import arguments, tool_stream
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


# -- what the client has ------------------------------------------------------------------


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "regenerate"])
def test_a_regeneration_cut_before_it_caught_up_goes_on_from_what_the_client_has(
    stack: Stack, prefill: bool
) -> None:
    """b regenerates the answer and breaks after 20 tokens, short of the 40 the client has:
    c must go on from the 40 (prefilled with them, or matching them), not from b's 20."""
    a = stack.sim("cut?after=40&tokens=60", name="a")
    b = stack.sim("cut?after=20&tokens=60", name="b")
    c = stack.sim("ok?tokens=60", name="c")
    chat = ordered(
        "chat", deployment("a", a), deployment("b", b), deployment("c", c, supports_prefill=prefill)
    )
    assert streamed_text(client(stack.gateway(config(chat)))) == full(60)  # each token once
    (regenerated,) = stack.attempts(b)
    (continued,) = stack.attempts(c)
    assert regenerated["prefill"] is False and continued["prefill"] is prefill


def test_a_tool_call_broken_twice_is_whole_and_once(stack: Stack) -> None:
    a = stack.sim("cut?shape=tool&after=8&tokens=12", name="a")
    b = stack.sim("cut?shape=tool&after=3&tokens=12", name="b")
    c = stack.sim("ok?shape=tool&tokens=12", name="c")
    chat = ordered(
        "chat", deployment("a", a), deployment("b", b), deployment("c", c, supports_prefill=True)
    )
    _, calls, finish = tool_stream(client(stack.gateway(config(chat))))
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["arguments"] == arguments(12)  # character for character, nothing twice
    assert calls[0]["id"] == "call_sim_1"  # a's id, the one the client saw first
    assert [entry["prefill"] for entry in stack.attempts(c)] == [False]  # never spliced into


# -- tool calls ---------------------------------------------------------------------------


def test_a_tool_call_cut_mid_arguments_is_regenerated_even_where_a_prefill_would_go(
    stack: Stack,
) -> None:
    """A Messages client (bridged) gets one tool_use block whose input is whole, from a
    deployment that could continue a prefill but is not given one while a call is open."""
    a = stack.sim("cut?shape=tool&after=5&tokens=10", name="a")
    b = stack.sim("ok?shape=tool&tokens=10", name="b")
    chat = ordered("chat", deployment("a", a), claude("b", b, messages="bridge"))
    gateway = stack.gateway(config(chat))
    with messages_api(gateway).messages.stream(
        model="chat", max_tokens=100, messages=HI, tools=TOOLS
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    (call,) = final.content
    assert call.type == "tool_use" and call.input == {"q": full(10)}
    assert kinds.count("content_block_start") == 1 and kinds[-1] == "message_stop"
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is False


def test_a_regeneration_that_says_text_where_the_client_has_a_call_ends_with_an_error(
    stack: Stack,
) -> None:
    """The regenerated answer is text, not the call the client has half of: nothing of it
    reaches the client (no text after a broken call), and the stream ends with an error."""
    a = stack.sim("cut?shape=tool&after=4&tokens=12", name="a")
    b = stack.sim("ok?tokens=12", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    text, finishes = "", []
    with pytest.raises(openai.APIError) as info:
        for chunk in client(gateway).chat.completions.create(
            model="chat", messages=MESSAGES, stream=True
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finishes.append(chunk.choices[0].finish_reason)
    assert text == "" and not any(finishes)
    assert "diverged" in str(info.value)
    # The same through a Messages client: a tool_use block, then Anthropic's error event.
    kinds: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        with messages_api(gateway).messages.stream(
            model="chat", max_tokens=100, messages=HI, tools=TOOLS
        ) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "content_block_start":
                    assert event.content_block.type == "tool_use"
    assert "message_stop" not in kinds and "message_delta" not in kinds
    assert raised.value.body["error"]["type"] == "api_error"  # type: ignore[index]


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


# -- native streams: nothing continues them ----------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error_type", "said"),
    [
        ("cut?after=5&tokens=20", "api_error", 5),
        ("stall?after=5&seconds=60&tokens=20", "timeout_error", 5),
        ("error_event?after=5&tokens=20", "api_error", 5),
    ],
)
def test_a_native_messages_stream_cut_ends_with_anthropics_error_event(
    stack: Stack, fault: str, error_type: str, said: int
) -> None:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok?tokens=20", name="b")
    gateway = stack.gateway(config(ordered("chat", claude("a", a), claude("b", b))))
    text, kinds = "", []
    with pytest.raises(anthropic.APIStatusError) as info:
        with messages_api(gateway).messages.stream(
            model="chat", max_tokens=100, messages=HI
        ) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text += event.delta.text
    assert text == full(said)
    assert "message_stop" not in kinds and "message_delta" not in kinds  # never a clean end
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert stack.attempts(b) == []  # a native stream is not continued elsewhere


def test_a_native_messages_stream_that_finished_without_message_stop_gets_it(
    stack: Stack,
) -> None:
    a = stack.sim("no_done?tokens=20", name="a")
    gateway = stack.gateway(config(ordered("chat", claude("a", a))))
    with messages_api(gateway).messages.stream(model="chat", max_tokens=100, messages=HI) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].type == "text" and final.content[0].text == full(20)


def test_a_native_responses_stream_cut_ends_failed_never_completed(stack: Stack) -> None:
    a = stack.sim("cut?after=5&tokens=20", name="a")
    b = stack.sim("ok?tokens=20", name="b")
    chat = ordered(
        "chat", deployment("a", a, responses="native"), deployment("b", b, responses="native")
    )
    api = client(stack.gateway(config(chat)))
    events = list(api.responses.create(model="chat", input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[-2:] == ["error", "response.failed"]
    assert "response.completed" not in kinds and "response.incomplete" not in kinds
    created, failed = events[0], events[-1]
    assert created.type == "response.created" and failed.type == "response.failed"
    assert failed.response.id == created.response.id and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))  # numbered on from the upstream's own
    with (
        pytest.raises(RuntimeError, match=r"`response\.completed`"),
        api.responses.stream(model="chat", input="hi") as stream,
    ):
        for _ in stream:
            pass
        stream.get_final_response()  # no response.completed: the SDK says so
    assert stack.attempts(b) == []

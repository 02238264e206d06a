"""The routing tests' failure scenarios on `/v1/responses`, bridged and native: the client
gets a whole answer, or a clean error in the Responses API's own form (a JSON OpenAI error
before the response started, an `error` event after it), never a truncated success."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import client, config, full, ordered
from tests.stack import Gateway, Stack, deployment, group

WAYS = ["bridge", "native"]


def dep(name: str, sim: Any, way: str, **extra: Any) -> dict[str, Any]:
    return deployment(name, sim, responses=way, **extra)


def whole(api: openai.OpenAI) -> str:
    return api.responses.create(model="chat", input="hi").output_text


def streamed(api: openai.OpenAI) -> tuple[str, list[str]]:
    """(the text the events carried, the event types in order)."""
    text, kinds = "", []
    for event in api.responses.create(model="chat", input="hi", stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    return text, kinds  # type: ignore[return-value]


def two(stack: Stack, fault: str, way: str, **extra: Any) -> tuple[Gateway, Any, Any]:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok", name="b")
    chat = ordered("chat", dep("a", a, way), dep("b", b, way))
    return stack.gateway(config(chat, **extra)), a, b


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("fault", ["429?retry_after=30", "500", "503", "reset"])
def test_a_refusing_or_resetting_deployment_is_failed_over(
    stack: Stack, way: str, fault: str
) -> None:
    gateway, a, b = two(stack, fault, way)
    api = client(gateway)
    for _ in range(2):
        assert whole(api) == full(16)
        text, kinds = streamed(api)
        assert text == full(16) and kinds[-1] == "response.completed"
    assert len(stack.attempts(b)) == 4
    assert stack.attempts(a)  # tried, and every answer came from b all the same


@pytest.mark.parametrize("way", WAYS)
def test_a_silent_deployment_is_failed_over_on_the_first_token_clock(
    stack: Stack, way: str
) -> None:
    gateway, a, _ = two(stack, "hang", way, timeouts={"answer": 5.0})
    api = client(gateway)
    started = time.monotonic()
    text, kinds = streamed(api)
    assert text == full(16) and kinds[-1] == "response.completed"
    assert 0.5 <= time.monotonic() - started <= 0.5 + 1.5
    started = time.monotonic()
    assert whole(api) == full(16)
    assert time.monotonic() - started < 0.5 + 2.0  # the first-token clock, not the answer's
    assert all(entry["stream"] for entry in stack.attempts(a))  # asked for as streams


@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
def test_a_broken_bridged_stream_is_continued_into_one_whole_answer(
    stack: Stack, fault: str
) -> None:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok?tokens=60", name="b")
    chat = ordered("chat", dep("a", a, "bridge"), dep("b", b, "bridge", supports_prefill=True))
    gateway = stack.gateway(config(chat))
    text, kinds = streamed(client(gateway))
    assert text == full(60) and kinds[-1] == "response.completed"
    assert len(stack.attempts(b)) == 1


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
def test_a_stream_nothing_can_continue_ends_with_an_error_event(
    stack: Stack, way: str, fault: str
) -> None:
    a = stack.sim(fault, name="a")
    gateway = stack.gateway(config(group("chat", dep("a", a, way))))
    api = client(gateway)
    text, kinds = streamed(api)
    assert text == full(20 if fault.startswith("stall") else 40)
    assert "error" in kinds
    assert "response.completed" not in kinds and "response.incomplete" not in kinds
    assert kinds[-1] == "response.failed"  # native too: the response ends failed
    with pytest.raises(RuntimeError), api.responses.stream(model="chat", input="hi") as stream:
        for _ in stream:
            pass
        stream.get_final_response()  # no response.completed: the SDK says so
    stack.set_behaviour(a, "ok")
    assert whole(api) == full(16)  # and the gateway is fine afterwards


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("stream", [False, True])
def test_when_nothing_can_answer_the_client_gets_an_openai_error(
    stack: Stack, way: str, stream: bool
) -> None:
    a = stack.sim("500", name="a")
    gateway = stack.gateway(config(group("chat", dep("a", a, way))))
    with pytest.raises(openai.APIStatusError) as caught:
        client(gateway).responses.create(model="chat", input="hi", stream=stream)
    assert caught.value.status_code >= 500
    assert isinstance(caught.value.body, dict) and caught.value.body.get("message")


@pytest.mark.parametrize("way", WAYS)
def test_an_upstreams_own_refusal_reaches_the_client(stack: Stack, way: str) -> None:
    a = stack.sim("context_length", name="a")
    gateway = stack.gateway(config(group("chat", dep("a", a, way))))
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).responses.create(model="chat", input="hi")
    assert caught.value.code == "context_length_exceeded"
    assert len(stack.attempts(a)) == 1

"""Agent traffic through the official openai SDK: streams that open with tool-call deltas or
reasoning reach the client as they come, and a stream cut inside a tool call is continued
with the very same call or ends with an error, never with a truncated call."""

from __future__ import annotations

import itertools
import time
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import MESSAGES, client, config, ordered
from tests.stack import Stack, deployment, group


def arguments(tokens: int) -> str:
    return '{"q": "' + "".join(f"tok{i} " for i in range(tokens)) + '"}'


def tool_stream(
    api: openai.OpenAI, model: str = "chat", **kw: Any
) -> tuple[list[float], dict[int, Any], str | None]:
    """(wall-clock arrival times of chunks with output, tool calls by index, finish reason).
    Wall clock, so they compare with the simulator's own send times."""
    arrivals: list[float] = []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    stream = api.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kw)
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        said = False
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            if call.function is not None:
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            said = True
        extra = delta.model_extra or {}
        if extra.get("reasoning_content"):
            entry = calls.setdefault(-1, {"reasoning": ""})
            entry["reasoning"] += extra["reasoning_content"]
            said = True
        if said:
            arrivals.append(time.time())
        finish = choice.finish_reason or finish
    return arrivals, calls, finish


@pytest.mark.parametrize("shape", ["tool", "reasoning"])
def test_tool_call_and_reasoning_deltas_stream_as_they_come(stack: Stack, shape: str) -> None:
    a = stack.sim(f"ok?shape={shape}&tokens=6&delay=0.4", name="a")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a)), timeouts={"first_token": 1.5})
    )
    arrivals, calls, finish = tool_stream(client(gateway))
    (attempt,) = stack.attempts(a)
    sent = attempt["sent"]  # when the upstream wrote each delta
    assert len(arrivals) == len(sent) == 6
    # Each delta reaches the client when the upstream sends it: nothing is held back
    # waiting for text that never comes.
    lags = [arrived - written for arrived, written in zip(arrivals, sent, strict=True)]
    assert lags[0] < 0.05, lags
    assert sorted(lags)[len(lags) // 2] < 0.05, lags
    assert max(lags) < 0.25, lags
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(0.25 <= gap <= 0.7 for gap in gaps), gaps
    if shape == "tool":
        assert finish == "tool_calls"
        assert calls[0]["name"] == "lookup" and calls[0]["arguments"] == arguments(6)
        assert calls[0]["id"].startswith("call_sim_")
    else:
        assert finish == "stop"
        assert calls[-1]["reasoning"] == "".join(f"tok{i} " for i in range(6))


def test_a_stream_cut_inside_a_tool_call_continues_with_the_same_call(stack: Stack) -> None:
    a = stack.sim("cut?shape=tool&after=4&tokens=12", name="a")
    b = stack.sim("ok?shape=tool&tokens=12", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    _, calls, finish = tool_stream(client(gateway))
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == "lookup"
    assert calls[0]["arguments"] == arguments(12)  # byte for byte, nothing twice
    assert calls[0]["id"] == "call_sim_1"  # the id the client saw first, not b's
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is False  # a tool call is regenerated, not prefilled


@pytest.mark.parametrize("other", ["ok?shape=tool&tokens=2", "ok?tokens=12"])
def test_a_tool_call_that_cannot_be_matched_ends_with_an_error(stack: Stack, other: str) -> None:
    a = stack.sim("cut?shape=tool&after=4&tokens=12", name="a")
    b = stack.sim(other, name="b")  # other arguments, or text instead of the call
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    seen: list[str | None] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client(gateway).chat.completions.create(
            model="chat", messages=MESSAGES, stream=True
        ):
            if chunk.choices:
                seen.append(chunk.choices[0].finish_reason)
    assert "upstream_stream_cut" in str(info.value.body)
    assert not any(seen)  # never a finish_reason for a call the client did not get whole


# -- whole answers guarded by the stream clocks ------------------------------------------


def test_a_silent_deployment_is_replaced_within_first_token_for_a_whole_answer(
    stack: Stack,
) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok?tokens=4", name="b")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b)),
            timeouts={"first_token": 1.0, "answer": 30, "request": 60},
        )
    )
    started = time.monotonic()
    reply = client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    took = time.monotonic() - started
    assert reply.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    assert reply.system_fingerprint == "sim:b"
    assert took < 1.0 + 1.0, took
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_a_whole_answer_that_stalls_midway_is_answered_whole_by_another(stack: Stack) -> None:
    a = stack.sim("stall?after=3&seconds=60&tokens=8", name="a")
    b = stack.sim("ok?tokens=8", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    reply = client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == "".join(f"tok{i} " for i in range(8))
    assert reply.system_fingerprint == "sim:b"
    assert reply.choices[0].finish_reason == "stop"


def test_a_whole_tool_call_answer_is_put_back_together(stack: Stack) -> None:
    a = stack.sim("ok?shape=tool&tokens=5", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    reply = client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_sim_")
    assert call.function.name == "lookup" and call.function.arguments == arguments(5)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.usage is not None and reply.usage.total_tokens > 0
    (sent,) = stack.attempts(a)
    assert sent["stream"] is True  # asked for as a stream, answered whole


def test_a_deployment_can_take_whole_answers_whole(stack: Stack) -> None:
    a = stack.sim("ok?tokens=3", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a, answers_as_streams=False))))
    reply = client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == "tok0 tok1 tok2 "
    (sent,) = stack.attempts(a)
    assert sent["stream"] is False  # its own setting wins over routing's default


def test_a_silent_whole_answer_leaves_time_for_a_failover(stack: Stack) -> None:
    """Not guarded by the stream clocks, an attempt gets only its share of the time left."""
    a = stack.sim("hang", name="a")
    b = stack.sim("ok?tokens=2", name="b")
    gateway = stack.gateway(
        config(
            ordered(
                "chat",
                deployment("a", a, answers_as_streams=False),
                deployment("b", b, answers_as_streams=False),
            ),
            timeouts={"answer": 300, "request": 4},
        )
    )
    started = time.monotonic()
    reply = client(gateway).chat.completions.create(model="chat", messages=MESSAGES)
    took = time.monotonic() - started
    assert reply.system_fingerprint == "sim:b"
    assert 1.5 <= took < 3.5, took  # half of the 4 s went to a, then b answered

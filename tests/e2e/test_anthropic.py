"""An Anthropic deployment behind Ballast, through the official openai SDK: chat streamed and
not, a tool round trip, its faults failed over, and failover and continuation across an
OpenAI-compatible deployment and an Anthropic one in one model group."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import FAST, full
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MASTER = "sk-master-anthropic-test"
MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
]


def claude(dep_id: str, sim: Any, **extra: Any) -> dict[str, Any]:
    return deployment(dep_id, sim, model="claude-sim", provider="anthropic", **extra)


def gateway_for(stack: Stack, *deployments: dict[str, Any]) -> Gateway:
    """One model group tried in the order given."""
    config = {"timeouts": FAST, "models": [group("chat", *deployments, strategy="ordered")]}
    return stack.gateway(config)


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)


def test_chat_whole_and_streamed(stack: Stack) -> None:
    sim = stack.sim()
    api = client(gateway_for(stack, claude("c", sim)))
    reply = api.chat.completions.create(model="chat", messages=MESSAGES, stop=["never"])
    assert reply.choices[0].message.content == full(16)
    assert reply.choices[0].finish_reason == "stop" and reply.model == "claude-sim"
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    text, usage, finish = "", None, None
    for chunk in api.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert text == full(16) and finish == "stop"
    assert usage is not None and usage.completion_tokens == 16
    sent = stack.attempts(sim)
    assert all(a["path"] == "/v1/messages" and a["headers"]["x-api-key"] for a in sent)
    assert all("authorization" not in a["headers"] for a in sent)  # its own credential only


def test_max_tokens_maps_to_length(stack: Stack) -> None:
    api = client(gateway_for(stack, claude("c", stack.sim())))
    reply = api.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3)
    assert reply.choices[0].message.content == full(3)
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_tool_round_trip(stack: Stack, stream: bool) -> None:
    sim = stack.sim("ok?shape=tool&tokens=3")
    api = client(gateway_for(stack, claude("c", sim)))
    asked: list[Any] = [{"role": "user", "content": "look it up"}]
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in api.chat.completions.create(
            model="chat", messages=asked, tools=TOOLS, stream=True
        ):
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "args": ""})
                entry["id"] += call.id or ""
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["args"] += call.function.arguments or ""
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["args"]
    else:
        reply = api.chat.completions.create(model="chat", messages=asked, tools=TOOLS)
        (tool_call,) = reply.choices[0].message.tool_calls or []
        call_id, finish = tool_call.id, reply.choices[0].finish_reason
        name, arguments = tool_call.function.name, tool_call.function.arguments  # type: ignore[union-attr]
    assert finish == "tool_calls" and name == "lookup"
    assert json.loads(arguments) == {"q": "tok0 tok1 tok2 "}
    stack.set_behaviour(sim, "ok?tokens=4")
    follow_up = [
        *asked,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "found it"},
    ]
    reply = api.chat.completions.create(model="chat", messages=follow_up, tools=TOOLS)
    assert reply.choices[0].message.content == full(4)


def test_anthropic_errors_in_the_taxonomy(stack: Stack) -> None:
    refusing = stack.sim("context_length")
    api = client(gateway_for(stack, claude("c", refusing)))
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model="chat", messages=MESSAGES)
    assert info.value.code == "context_length_exceeded"
    assert "prompt is too long" in str(info.value.message)


@pytest.mark.parametrize("fault", ["429?retry_after=30", "503", "500", "reset"])
def test_an_anthropic_fault_fails_over_and_cools(stack: Stack, fault: str) -> None:
    bad, good = stack.sim(fault, name="bad"), stack.sim(name="good")
    gateway = gateway_for(stack, claude("bad", bad), deployment("good", good))
    api = client(gateway)
    for _ in range(2):
        reply = api.chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.choices[0].message.content == full(16)
    if fault != "500" and fault != "reset":  # a rate limit and an overload cool it down
        assert len(stack.attempts(bad)) == 1


def test_openai_rate_limited_then_cut_answers_whole_from_anthropic(stack: Stack) -> None:
    """The OpenAI deployment answers 429, later it is cut mid-stream: the client gets whole
    answers, no error, and each answer names the model that really answered."""
    openai_sim, claude_sim = stack.sim("429", name="oa"), stack.sim("ok?tokens=60", name="cl")
    gateway = gateway_for(
        stack, deployment("oa", openai_sim, model="gpt-sim"), claude("cl", claude_sim)
    )
    api = client(gateway)
    reply = api.chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == full(60) and reply.model == "claude-sim"
    text = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert text == full(60)


@pytest.mark.parametrize("first", ["openai", "anthropic"])
def test_a_cut_stream_continues_on_the_other_provider(stack: Stack, first: str) -> None:
    cut = stack.sim("cut?after=20&tokens=60", name="cut")
    whole = stack.sim("ok?tokens=60", name="whole")
    if first == "openai":
        deployments = [deployment("cut", cut, model="gpt-sim"), claude("whole", whole)]
    else:
        deployments = [claude("cut", cut), deployment("whole", whole, model="gpt-sim")]
    api = client(gateway_for(stack, *deployments))
    text, finish, usage = "", None, None
    for chunk in api.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert text == full(60) and finish == "stop"
    (continued,) = stack.attempts(whole)
    if first == "openai":  # Anthropic goes on from the prefill: only the rest is generated
        # The prefill goes without its trailing space: the space, then tok20 .. tok59.
        assert continued["prefill"] is True and continued["tokens"] == 41
    assert usage is not None


def test_a_provider_setting_is_checked_at_load(stack: Stack) -> None:
    from ballast.config import ConfigError, parse_settings

    sim = stack.sim()
    bad = {"models": [group("chat", claude("c", sim, anthropic={"max_tokens": 0}))]}
    with pytest.raises(ConfigError, match="max_tokens"):
        parse_settings(bad)
    misplaced = {"models": [group("chat", deployment("c", sim, anthropic={"version": "x"}))]}
    with pytest.raises(ConfigError, match="anthropic section needs provider: anthropic"):
        parse_settings(misplaced)


def test_spend_is_priced_by_the_model_that_answered(stack: Stack, tmp_path: Path) -> None:
    """A group of an OpenAI deployment and an Anthropic one; the OpenAI one answers 429, and
    once cooled down it is cut mid-stream. Every answer is whole, no error reaches the
    client, and spend is priced as the Anthropic model that really answered."""
    openai_sim, claude_sim = stack.sim("429", name="oa"), stack.sim("ok?tokens=60", name="cl")
    gateway = stack.gateway(
        {
            "timeouts": FAST,
            "routing": {"rate_limit_cooldown": 0.3},
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            # $1 a token on OpenAI, $3 on Anthropic: the total says who answered.
            "prices": {
                "gpt-sim": {"input": 1_000_000, "output": 1_000_000},
                "claude-sim": {"input": 3_000_000, "output": 3_000_000},
            },
            "models": [
                group(
                    "chat",
                    deployment("oa", openai_sim, model="gpt-sim"),
                    claude("cl", claude_sim),
                    strategy="ordered",
                )
            ],
        }
    )
    status, created = admin(gateway, "POST", "/admin/keys", {"name": "t"})
    assert status == 201
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=created["key"], max_retries=0)
    reply = api.chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == full(60) and reply.model == "claude-sim"
    assert reply.usage is not None
    tokens = reply.usage.total_tokens
    stack.set_behaviour(openai_sim, "cut?after=20&tokens=60")
    time.sleep(0.5)  # the rate limit's cooldown passes: the OpenAI deployment is tried again
    text, usage = "", None
    for chunk in api.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == full(60) and usage is not None
    assert [a["outcome"] for a in stack.attempts(openai_sim)] == ["429", "cut"]
    tokens += usage.total_tokens
    spend: dict[str, Any] = {}
    for _ in range(100):
        status, spend = admin(gateway, "GET", f"/admin/keys/spend?id={created['id']}")
        if status == 200 and spend["spend"] >= 3.0 * tokens:
            break
        time.sleep(0.05)
    assert spend["spend"] == pytest.approx(3.0 * tokens)


def admin(gateway: Gateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        gateway.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.mark.parametrize(
    "fault",
    [
        "stall?after=20&seconds=60&tokens=60",
        "slow_first?delay=30&tokens=60",
        "hang",
        "no_done?tokens=60",
    ],
)
def test_a_hostile_anthropic_stream_is_healed(stack: Stack, fault: str) -> None:
    """The stream clocks guard an Anthropic stream as any other: silence before the first
    token fails over, a stall after it is continued, an end without message_stop is cut."""
    bad, good = stack.sim(fault, name="bad"), stack.sim("ok?tokens=60", name="good")
    api = client(gateway_for(stack, claude("bad", bad), deployment("good", good)))
    text = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert text == full(60)
    assert len(stack.attempts(good)) == (0 if fault.startswith("no_done") else 1)


def test_what_messages_cannot_say_goes_to_a_provider_that_can(stack: Stack) -> None:
    claude_sim, openai_sim = stack.sim(name="cl"), stack.sim(name="oa")
    api = client(gateway_for(stack, claude("cl", claude_sim), deployment("oa", openai_sim)))
    audio: list[Any] = [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}
    ]
    reply = api.chat.completions.create(model="chat", messages=audio)
    assert reply.choices[0].message.content == full(16)
    assert api.embeddings.create(model="chat", input="x").data
    assert stack.attempts(claude_sim) == [] and len(stack.attempts(openai_sim)) == 2
    alone = client(gateway_for(stack, claude("cl", claude_sim)))
    with pytest.raises(openai.BadRequestError) as info:
        alone.chat.completions.create(model="chat", messages=audio)
    assert info.value.code == "unsupported_request" and "input_audio" in info.value.message


@pytest.mark.parametrize("first", ["anthropic", "openai"])
def test_an_error_event_mid_stream_is_continued_and_an_overload_cools(
    stack: Stack, first: str
) -> None:
    """Anthropic's in-band overloaded_error (OpenAI's in-band error alike) after 20 tokens:
    the stream is continued elsewhere into one whole answer, a whole answer asked for as a
    stream fails over, and an overloaded deployment is cooled down."""
    failing = stack.sim("error_event?after=20&tokens=60", name="failing")
    whole = stack.sim("ok?tokens=60", name="whole")
    if first == "anthropic":
        deployments = [claude("failing", failing), deployment("whole", whole, model="gpt-sim")]
    else:
        deployments = [deployment("failing", failing, model="gpt-sim"), claude("whole", whole)]
    api = client(gateway_for(stack, *deployments))
    text = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert text == full(60)
    reply = api.chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == full(60)
    tried = len(stack.attempts(failing))
    assert tried == (1 if first == "anthropic" else 2)  # the overload cooled it down


def test_with_extended_thinking_a_continuation_regenerates(stack: Stack) -> None:
    """Messages refuses a bare-text prefill while thinking is on, so the Anthropic
    deployment regenerates the answer and Ballast relays only what the client lacks."""
    cut, whole = stack.sim("cut?after=20&tokens=60", name="cut"), stack.sim("ok?tokens=60")
    api = client(gateway_for(stack, deployment("cut", cut, model="gpt-sim"), claude("w", whole)))
    text = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            extra_body={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        )
        if c.choices
    )
    assert text == full(60)
    (continued,) = stack.attempts(whole)
    assert continued["prefill"] is False and continued["tokens"] == 60

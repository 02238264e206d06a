"""The Anthropic Messages API through Ballast, with the official `anthropic` SDK, in front of
the chat simulator: the SDK's own parsed objects are asserted, streamed and not."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group, sqlite_state, wait_for

HI: list[Any] = [{"role": "user", "content": "hello there"}]
TOOLS: list[Any] = [
    {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n not really a picture").decode()
MASTER = "sk-master-for-messages-0123456789"


def full(tokens: int) -> str:
    return "".join(f"tok{i} " for i in range(tokens))


def client(gateway: Gateway, key: str = "sk-client") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=20)


@pytest.fixture
def gateway(stack: Stack, sim: SimServer) -> Gateway:
    return stack.gateway(
        {
            "models": [
                group("claude", deployment("a", sim, model="sim-chat")),
                group("cached", deployment("c", sim, model="sim-chat"), cache={"ttl": 60}),
            ]
        }
    )


def post(gateway: Gateway, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(
        gateway.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# -- text, system prompts, limits ------------------------------------------------------


def test_create_answers_with_a_text_block_stop_reason_and_usage(gateway: Gateway) -> None:
    reply = client(gateway).messages.create(
        model="claude", max_tokens=100, system="Answer briefly.", messages=HI
    )
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.id.startswith("msg_")
    assert reply.model == "sim-chat"  # the model that answered
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].type == "text" and reply.content[0].text == full(16)
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    # The simulator counts words: "Answer briefly." and "hello there".
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 16)


def test_system_blocks_and_max_tokens(gateway: Gateway) -> None:
    reply = client(gateway).messages.create(
        model="claude",
        max_tokens=3,
        system=[{"type": "text", "text": "one two"}, {"type": "text", "text": "three"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
        stop_sequences=["never"],
        metadata={"user_id": "user-1"},
    )
    assert reply.content[0].type == "text" and reply.content[0].text == full(3)
    assert reply.stop_reason == "max_tokens"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 3)


def test_stream_events_in_order_and_the_final_message(gateway: Gateway) -> None:
    with client(gateway).messages.stream(
        model="claude", max_tokens=100, system="Be brief.", messages=HI
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "error" not in kinds
    assert final.content[0].type == "text" and final.content[0].text == full(16)
    assert final.stop_reason == "end_turn"
    # Real counts at the end: message_delta carries the upstream's input and output tokens.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 16)


def test_raw_stream_starts_with_message_start_carrying_input_usage(gateway: Gateway) -> None:
    events = list(
        client(gateway).messages.create(model="claude", max_tokens=4, messages=HI, stream=True)
    )
    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.output_tokens == 0
    assert start.message.usage.input_tokens > 0  # the estimate: no chat chunk says it early
    delta = events[-2]
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "max_tokens"
    assert delta.usage.output_tokens == 4 and delta.usage.input_tokens == 2


# -- tools -----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_a_tool_use_round_trip(
    stack: Stack, sim: SimServer, gateway: Gateway, streamed: bool
) -> None:
    api = client(gateway)
    stack.set_behaviour(sim, "ok?shape=tool&tokens=3")
    question: list[Any] = [{"role": "user", "content": "look up the word"}]
    if streamed:
        with api.messages.stream(
            model="claude", max_tokens=50, messages=question, tools=TOOLS,
            tool_choice={"type": "any"},
        ) as stream:  # fmt: skip
            deltas = [e for e in stream if e.type == "content_block_delta"]
            reply = stream.get_final_message()
        # The arguments came as several input_json_delta pieces, put back together.
        assert len(deltas) >= 3 and all(d.delta.type == "input_json_delta" for d in deltas)
    else:
        reply = api.messages.create(  # type: ignore[assignment]
            model="claude", max_tokens=50, messages=question, tools=TOOLS,
            tool_choice={"type": "tool", "name": "lookup"},
        )  # fmt: skip
    assert reply.stop_reason == "tool_use"
    (call,) = reply.content
    assert call.type == "tool_use"
    assert call.name == "lookup" and call.input == {"q": full(3)}
    assert call.id
    stack.set_behaviour(sim, "ok?tokens=5")
    answer = api.messages.create(
        model="claude",
        max_tokens=50,
        tools=TOOLS,
        messages=[
            *question,
            {"role": "assistant", "content": [c.model_dump() for c in reply.content]},  # type: ignore[list-item,misc]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "a word"},
                    {"type": "text", "text": "so?"},
                ],
            },
        ],
    )
    assert answer.stop_reason == "end_turn"
    assert answer.content[0].type == "text" and answer.content[0].text == full(5)
    # "look up the word", the tool result "a word" and "so?": the tool's output reached it.
    assert answer.usage.input_tokens == 7


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_reasoning_comes_as_a_thinking_block(
    stack: Stack, sim: SimServer, gateway: Gateway, streamed: bool
) -> None:
    stack.set_behaviour(sim, "ok?shape=reasoning&tokens=4")
    api = client(gateway)
    if streamed:
        with api.messages.stream(model="claude", max_tokens=50, messages=HI) as stream:
            reply = stream.get_final_message()
    else:
        reply = api.messages.create(model="claude", max_tokens=50, messages=HI)  # type: ignore[assignment]
    assert reply.content[0].type == "thinking"
    assert reply.content[0].thinking == full(4)


# -- images ----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_image_blocks_base64_and_url(gateway: Gateway, streamed: bool) -> None:
    content: list[Any] = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
        {"type": "text", "text": "describe these"},
    ]
    api = client(gateway)
    messages: list[Any] = [{"role": "user", "content": content}]
    if streamed:
        with api.messages.stream(model="claude", max_tokens=6, messages=messages) as stream:
            reply = stream.get_final_message()
    else:
        reply = api.messages.create(model="claude", max_tokens=6, messages=messages)  # type: ignore[assignment]
    assert reply.content[0].type == "text" and reply.content[0].text == full(6)
    assert reply.usage.input_tokens == 2  # the text part; the images went as image_url parts


# -- count_tokens and bad input ----------------------------------------------------------


def test_count_tokens_is_an_estimate_that_grows_with_the_prompt(gateway: Gateway) -> None:
    api = client(gateway)
    short = api.messages.count_tokens(model="claude", messages=HI)
    longer = api.messages.count_tokens(
        model="claude", system="You are a careful assistant. " * 20, messages=HI, tools=TOOLS
    )
    assert 0 < short.input_tokens < longer.input_tokens
    assert longer.input_tokens >= 20 * 5  # never below the words it was given
    with pytest.raises(anthropic.NotFoundError) as info:
        api.messages.count_tokens(model="nope", messages=HI)
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_bad_input_is_a_400_invalid_request_error_naming_the_field(gateway: Gateway) -> None:
    status, body = post(gateway, "/v1/messages", {"model": "claude", "messages": HI}, {})
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("max_tokens:")
    bad_image = [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client(gateway).messages.create(model="claude", max_tokens=5, messages=bad_image)  # type: ignore[arg-type]
    assert "messages.0.content.0.source.type" in info.value.message
    with pytest.raises(anthropic.NotFoundError):
        client(gateway).messages.create(model="nope", max_tokens=5, messages=HI)


# -- the response cache ------------------------------------------------------------------


def test_a_cached_answer_is_served_in_this_shape(
    stack: Stack, sim: SimServer, gateway: Gateway
) -> None:
    api = client(gateway)
    first = api.messages.with_raw_response.create(model="cached", max_tokens=7, messages=HI)
    assert first.headers["x-ballast-cache"] == "miss"
    again = api.messages.with_raw_response.create(model="cached", max_tokens=7, messages=HI)
    assert again.headers["x-ballast-cache"] == "hit"
    reply = again.parse()
    assert reply.content[0].type == "text" and reply.content[0].text == full(7)
    assert reply.usage.output_tokens == 7
    with api.messages.stream(model="cached", max_tokens=8, messages=HI) as stream:
        streamed = stream.get_final_message()  # a miss, kept as it streams
    with api.messages.stream(model="cached", max_tokens=8, messages=HI) as stream:
        assert stream.response.headers["x-ballast-cache"] == "hit"
        replayed = stream.get_final_message()
    assert replayed.content[0].type == "text" and replayed.content[0].text == full(8)
    assert replayed.content == streamed.content
    assert replayed.stop_reason == "max_tokens" and replayed.usage.output_tokens == 8
    assert len(stack.attempts(sim)) == 2  # one upstream call per distinct request


# -- keys, limits and spend --------------------------------------------------------------


@pytest.fixture
def keyed(stack: Stack, sim: SimServer, tmp_path: Path) -> Gateway:
    return stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": {"input": 1_000_000, "output": 1_000_000}},  # $1 per token
            "models": [
                group("claude", deployment("a", sim, model="sim-chat")),
                group("other", deployment("b", sim)),
            ],
        }
    )


def new_key(gateway: Gateway, **options: Any) -> tuple[str, str]:
    status, body = post(
        gateway, "/admin/keys", {"name": "m", **options}, {"authorization": f"Bearer {MASTER}"}
    )
    assert status == 201, body
    return body["key"], body["id"]


def spend_of(gateway: Gateway, key_id: str, at_least: float) -> float:
    spent = 0.0
    for _ in range(100):
        request = urllib.request.Request(
            gateway.url + f"/admin/keys/spend?id={key_id}",
            headers={"authorization": f"Bearer {MASTER}"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            spent = json.loads(response.read())["spend"]
        if spent >= at_least:
            break
        time.sleep(0.05)
    return spent


def test_a_virtual_key_in_x_api_key_works_and_its_spend_is_recorded(keyed: Gateway) -> None:
    key, key_id = new_key(keyed)
    # As Anthropic's clients send it: x-api-key, no Authorization header at all.
    api = anthropic.Anthropic(
        base_url=keyed.url, api_key=None, default_headers={"x-api-key": key}, max_retries=0
    )
    reply = api.messages.create(model="claude", max_tokens=100, messages=HI)
    assert reply.usage.output_tokens == 16
    assert spend_of(keyed, key_id, 18.0) == pytest.approx(18.0)  # 2 + 16 tokens at $1
    with api.messages.stream(model="claude", max_tokens=4, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 4
    assert spend_of(keyed, key_id, 24.0) == pytest.approx(24.0)  # the stream settled: 2 + 4
    # The SDK's own default (Authorization: Bearer) works as well.
    assert client(keyed, key).messages.create(model="claude", max_tokens=2, messages=HI)


def test_a_bad_key_is_a_401_authentication_error_in_anthropic_shape(keyed: Gateway) -> None:
    for api in (
        client(keyed, "sk-bl-unknown"),
        anthropic.Anthropic(
            base_url=keyed.url, api_key=None, default_headers={"x-api-key": "bad"}, max_retries=0
        ),
    ):
        with pytest.raises(anthropic.AuthenticationError) as info:
            api.messages.create(model="claude", max_tokens=5, messages=HI)
        assert info.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
        }
        with pytest.raises(anthropic.AuthenticationError):
            api.messages.count_tokens(model="claude", messages=HI)


def test_allowlists_and_rate_limits_answer_in_anthropic_shape(keyed: Gateway) -> None:
    key, _ = new_key(keyed, models=["claude"], rpm=2)
    api = client(keyed, key)
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        api.messages.create(model="other", max_tokens=5, messages=HI)
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    for _ in range(2):
        api.messages.create(model="claude", max_tokens=5, messages=HI)
    with pytest.raises(anthropic.RateLimitError) as limited:
        api.messages.create(model="claude", max_tokens=5, messages=HI)
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(limited.value.response.headers["retry-after"]) >= 1


def metric(gateway: Gateway, line_start: str) -> float:
    with urllib.request.urlopen(gateway.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_requests_are_counted_by_shape(gateway: Gateway) -> None:
    client(gateway).messages.create(model="claude", max_tokens=2, messages=HI)
    with client(gateway).messages.stream(model="claude", max_tokens=2, messages=HI) as stream:
        stream.get_final_message()
    anthropic_ok = 'ballast_requests_by_shape_total{outcome="ok",shape="anthropic"}'
    wait_for(lambda: metric(gateway, anthropic_ok) == 2)
    openai_ok = 'ballast_requests_by_shape_total{outcome="ok",shape="openai"}'
    assert metric(gateway, openai_ok) == 0


def test_a_spent_budget_is_a_rate_limit_error_in_anthropic_shape(keyed: Gateway) -> None:
    key, key_id = new_key(keyed, budget=50.0, budget_period="total")
    api = client(keyed, key)
    api.messages.create(model="claude", max_tokens=20, messages=HI)  # $18
    assert spend_of(keyed, key_id, 18.0) == pytest.approx(18.0)
    # The next one's worst case (20 output tokens and the prompt's estimate, about $45) does
    # not fit in the $32 left: refused before it goes upstream.
    with pytest.raises(anthropic.RateLimitError) as info:
        api.messages.create(model="claude", max_tokens=20, messages=HI)
    assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "budget" in info.value.body["error"]["message"]  # type: ignore[index]

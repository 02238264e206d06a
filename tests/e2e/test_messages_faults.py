"""The routing tests' failure scenarios on the Messages shape, through the `anthropic` SDK:
429s, 5xx, resets, a silent upstream, a stall and a cut mid-stream. The client gets a whole
answer, or a clean error in Anthropic's shape (the SDK raises its typed error), never a
truncated success."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import anthropic
import pytest

from tests.e2e.test_messages import metric
from tests.e2e.test_routing import config, full, ordered
from tests.stack import Gateway, Stack, deployment, group, wait_for

HI: list[Any] = [{"role": "user", "content": "hi"}]


def client(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="sk-client", max_retries=0, timeout=20)


def create(gateway: Gateway, **kw: Any) -> Any:
    return client(gateway).messages.create(model="chat", max_tokens=100, messages=HI, **kw)


def streamed(gateway: Gateway) -> tuple[str, list[str], Any]:
    """(text, event types, the final message) of one streamed request."""
    text, kinds = "", []
    with client(gateway).messages.stream(model="chat", max_tokens=100, messages=HI) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = stream.get_final_message()
    return text, kinds, final  # type: ignore[return-value]


def whole(text: str, kinds: list[str], final: Any, tokens: int) -> None:
    assert text == full(tokens)
    assert final.content[0].text == full(tokens) and final.stop_reason == "end_turn"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1


@pytest.mark.parametrize("fault", ["429?retry_after=30", "500", "503", "reset"])
def test_a_failing_deployment_is_failed_over_silently(stack: Stack, fault: str) -> None:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    reply = create(gateway)
    assert reply.content[0].text == full(16) and reply.stop_reason == "end_turn"
    whole(*streamed(gateway), 16)
    assert len(stack.attempts(b)) == 2


def test_a_silent_deployment_is_replaced_streamed_and_not(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(
        config(ordered("chat", deployment("a", a), deployment("b", b)), timeouts={"answer": 0.5})
    )
    started = time.monotonic()
    whole(*streamed(gateway), 16)
    assert time.monotonic() - started <= 0.5 + 1.0  # the first-token clock, then b
    assert create(gateway).content[0].text == full(16)
    assert len(stack.attempts(b)) == 2


@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "regenerate"])
def test_a_broken_stream_is_continued_into_one_whole_message(
    stack: Stack, fault: str, prefill: bool
) -> None:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok?tokens=60", name="b")
    gateway = stack.gateway(
        config(ordered("chat", deployment("a", a), deployment("b", b, supports_prefill=prefill)))
    )
    text, kinds, final = streamed(gateway)
    whole(text, kinds, final, 60)  # no repeated or missing token, one message
    assert kinds.count("content_block_start") == 1
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is prefill


@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
def test_a_broken_stream_nothing_can_continue_ends_with_an_error_event(
    stack: Stack, fault: str
) -> None:
    a = stack.sim(fault, name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    text, kinds = "", []
    stream = client(gateway).messages.create(model="chat", max_tokens=100, messages=HI, stream=True)
    with pytest.raises(anthropic.APIStatusError) as info:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
    assert text == full(20 if fault.startswith("stall") else 40)
    assert "message_stop" not in kinds and "message_delta" not in kinds  # never a success
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    label = "inter_chunk_timeout" if fault.startswith("stall") else "stream_cut"
    assert label in body["error"]["message"]
    assert body["error"]["type"] == ("timeout_error" if fault.startswith("stall") else "api_error")
    # Counted as a stream that ended in an error, under this shape.
    errored = 'ballast_requests_by_shape_total{outcome="stream_error",shape="anthropic"}'
    wait_for(lambda: metric(gateway, errored) == 1)
    # The gateway is fine afterwards.
    stack.set_behaviour(a, "ok?tokens=60")
    whole(*streamed(gateway), 60)


def test_a_full_outage_is_an_anthropic_error_streamed_and_not(stack: Stack) -> None:
    a = stack.sim("500", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    with pytest.raises(anthropic.InternalServerError) as info:
        create(gateway)
    assert info.value.status_code == 500
    assert info.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    with pytest.raises(anthropic.InternalServerError):
        streamed(gateway)


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_refusal_reaches_the_client_in_anthropic_shape(
    stack: Stack, stream: bool
) -> None:
    a = stack.sim("content_filter?reason=violence", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    with pytest.raises(anthropic.BadRequestError) as info:
        if stream:
            streamed(gateway)
        else:
            create(gateway)
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "violence" in body["error"]["message"]  # the upstream's own words
    assert len(stack.attempts(a)) == 1


def raw_stream(gateway: Gateway) -> bytes:
    parts = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)  # type: ignore[arg-type]
    body = json.dumps({"model": "chat", "max_tokens": 10, "messages": HI, "stream": True})
    conn.request("POST", "/v1/messages", body, {"content-type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    return data


def test_keep_alive_is_ping_events_and_the_sdk_gets_the_whole_answer(stack: Stack) -> None:
    a = stack.sim("ok?first_token_delay=1.2&tokens=4", name="a")
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a)),
            timeouts={"first_token": 5},
            routing={"stream_keepalive": 0.3},
        )
    )
    data = raw_stream(gateway)
    assert data.startswith(b"event: ping\n")
    assert b": keep-alive" not in data
    assert data.index(b"event: message_start") > data.rindex(b"event: ping")
    assert data.rstrip().endswith(b'data: {"type":"message_stop"}')
    whole(*streamed(gateway), 4)


def test_a_failure_after_keep_alive_started_is_an_error_event(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a)),
            timeouts={"first_token": 1.0},
            routing={"stream_keepalive": 0.3},
        )
    )
    data = raw_stream(gateway)
    assert data.startswith(b"event: ping\n")
    events = [e for e in data.split(b"\n\n") if e]
    assert events[-1].startswith(b"event: error\ndata: ")
    error = json.loads(events[-1].split(b"data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] in ("timeout_error", "api_error")
    assert b"message_stop" not in data


def test_a_gateway_at_capacity_sheds_with_an_overloaded_error(stack: Stack) -> None:
    a = stack.sim("ok?tokens=2&latency=1.5", name="a")
    slow = {"first_token": 5, "answer": 5}
    gateway = stack.gateway(
        {**config(group("chat", deployment("a", a)), timeouts=slow), "server": {"max_in_flight": 1}}
    )
    answered: list[Any] = []
    busy = threading.Thread(target=lambda: answered.append(create(gateway)))
    busy.start()
    try:
        wait_for(lambda: len(stack.attempts(a)) == 1)  # the one slot is taken
        with pytest.raises(anthropic.APIStatusError) as info:
            create(gateway)
    finally:
        busy.join(10)
    assert info.value.status_code == 529  # Anthropic's overloaded status, not a 503
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": "Ballast is at capacity right now; retry shortly.",
        },
    }
    assert info.value.response.headers["retry-after"] == "1"
    assert answered[0].content[0].text == full(2)  # the request in the slot was served


def test_a_tool_call_cut_mid_arguments_is_continued_into_one_tool_use_block(
    stack: Stack,
) -> None:
    a = stack.sim("cut?after=4&tokens=10&shape=tool", name="a")
    b = stack.sim("ok?tokens=10&shape=tool", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    tools: list[Any] = [{"name": "lookup", "input_schema": {"type": "object"}}]
    with client(gateway).messages.stream(
        model="chat", max_tokens=100, messages=HI, tools=tools
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "lookup"
    assert call.input == {"q": full(10)}  # every argument piece once, in order
    assert final.stop_reason == "tool_use"
    assert kinds.count("content_block_start") == 1 and kinds[-1] == "message_stop"
    assert len(stack.attempts(b)) == 1

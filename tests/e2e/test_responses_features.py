"""The pipeline's other features on `/v1/responses`: keep-alive while the first token is
awaited (and a failure after the start as a numbered error event), the response cache,
whose kept chat answers are served in the Responses shape, and hedging."""

from __future__ import annotations

import time

import pytest

from tests.e2e.test_routing import client, config, full, ordered
from tests.stack import Stack, deployment, group

KEEPALIVE = {"stream_keepalive": 0.3}


@pytest.mark.parametrize("way", ["bridge", "native"])
def test_keep_alive_comments_do_not_disturb_the_sdk(stack: Stack, way: str) -> None:
    a = stack.sim("ok?first_token_delay=1.2&tokens=4", name="a")
    chat = group("chat", deployment("a", a, responses=way))
    gateway = stack.gateway(config(chat, timeouts={"first_token": 5}, routing=KEEPALIVE))
    with client(gateway).responses.stream(model="chat", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == full(4) and final.status == "completed"


@pytest.mark.parametrize("way", ["bridge", "native"])
def test_a_failure_after_keep_alive_started_the_stream_is_an_error_event(
    stack: Stack, way: str
) -> None:
    a = stack.sim("hang", name="a")
    chat = group("chat", deployment("a", a, responses=way))
    gateway = stack.gateway(config(chat, timeouts={"first_token": 0.8}, routing=KEEPALIVE))
    events = list(client(gateway).responses.create(model="chat", input="hi", stream=True))
    (error,) = events  # the keep-alive comments are not events; the error is the first one
    assert error.type == "error" and error.sequence_number == 0
    assert error.code == "upstream_timeout" and "first_token_timeout" in error.message


def test_a_cached_answer_is_served_as_a_response(stack: Stack) -> None:
    sim = stack.sim()
    gateway = stack.gateway(
        config(group("chat", deployment("a", sim, model="sim-chat"), cache={"ttl": 60}))
    )
    api = client(gateway)
    first = api.responses.with_raw_response.create(model="chat", input="hello")
    assert first.headers["x-ballast-cache"] == "miss"
    again = api.responses.with_raw_response.create(model="chat", input="hello")
    assert again.headers["x-ballast-cache"] == "hit"
    kept, served = first.parse(), again.parse()
    assert served.output_text == kept.output_text == full(16)
    assert served.id != kept.id and served.usage == kept.usage
    with api.responses.stream(model="chat", input="streamed") as stream:
        stream.get_final_response()
    raw = api.responses.with_raw_response.create(model="chat", input="streamed", stream=True)
    assert raw.headers["x-ballast-cache"] == "hit"
    (done,) = [e for e in raw.parse() if e.type == "response.completed"]
    assert done.response.output_text == full(16) and done.response.usage is not None
    assert len(stack.attempts(sim)) == 2  # each answer went upstream once


@pytest.mark.parametrize("way", ["bridge", "native"])
def test_a_slow_first_token_is_hedged(stack: Stack, way: str) -> None:
    slow = stack.sim("slow_first?delay=3", name="slow")
    fast = stack.sim("ok", name="fast")
    chat = ordered(
        "chat", deployment("s", slow, responses=way), deployment("f", fast, responses=way)
    )
    gateway = stack.gateway(config(chat, timeouts={"first_token": 5}, routing={"hedge_after": 0.1}))
    started = time.monotonic()
    with client(gateway).responses.stream(model="chat", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == full(16)
    assert time.monotonic() - started < 2.0
    assert len(stack.attempts(fast)) == 1

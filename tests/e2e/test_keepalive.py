"""Keep-alive while a stream waits for its first token: the response starts and SSE comments
keep the connection busy; the official SDK ignores them and gets the whole answer; a
failover stays silent, and a final failure is an error event."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from tests.e2e.test_routing import MESSAGES, client, config, full, ordered, stream_chat
from tests.stack import Gateway, Stack, deployment, group

KEEPALIVE = {"stream_keepalive": 0.3}


def raw_stream(gateway: Gateway) -> tuple[int, float, bytes]:
    """(status, seconds until the status line, the whole body) of one streamed request."""
    parts = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)  # type: ignore[arg-type]
    body = json.dumps({"model": "chat", "messages": MESSAGES, "stream": True})
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = conn.getresponse()
    waited = time.monotonic() - started
    data = response.read()
    conn.close()
    return response.status, waited, data


def test_a_long_wait_for_the_first_token_keeps_the_connection_busy(stack: Stack) -> None:
    a = stack.sim("ok?first_token_delay=1.5&tokens=4", name="a")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a)), timeouts={"first_token": 5}, routing=KEEPALIVE)
    )
    status, waited, data = raw_stream(gateway)
    assert status == 200
    assert waited < 0.3 + 0.3  # the response started after one keep-alive interval
    assert data.startswith(b": keep-alive\n\n")
    assert 3 <= data.count(b": keep-alive\n\n") <= 6
    assert data.rstrip().endswith(b"data: [DONE]")
    # The official SDK skips the comments and gets the whole answer.
    text, who, finish = stream_chat(client(gateway))
    assert (text, who, finish) == (full(4), "a", "stop")


def test_a_failover_after_the_response_started_is_silent(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok?tokens=5", name="b")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b)),
            timeouts={"first_token": 1.0},
            routing=KEEPALIVE,
        )
    )
    text, who, finish = stream_chat(client(gateway))
    assert (text, who, finish) == (full(5), "b", "stop")


def test_a_final_failure_after_the_response_started_is_an_error_event(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a)), timeouts={"first_token": 1.0}, routing=KEEPALIVE)
    )
    status, _, data = raw_stream(gateway)
    assert status == 200
    assert data.count(b": keep-alive\n\n") >= 2
    last = data.strip().split(b"\n\n")[-1]
    error: dict[str, Any] = json.loads(last[len(b"data: ") :])["error"]
    assert error["code"] == "upstream_timeout"
    with pytest.raises(openai.APIError):
        for _ in client(gateway).chat.completions.create(
            model="chat", messages=MESSAGES, stream=True
        ):
            pass


def test_without_keep_alive_a_refusal_is_still_a_status(stack: Stack) -> None:
    a = stack.sim("context_length", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a)), routing=KEEPALIVE))
    with pytest.raises(openai.BadRequestError):
        stream_chat(client(gateway))


def test_headers_at_once_start_every_stream_before_its_first_token(stack: Stack) -> None:
    a = stack.sim("ok?first_token_delay=0.6&tokens=3", name="a")
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a)),
            timeouts={"first_token": 2},
            routing={"stream_headers_at_once": True},
        )
    )
    status, waited, data = raw_stream(gateway)
    assert status == 200 and waited < 0.3
    assert data.rstrip().endswith(b"data: [DONE]")

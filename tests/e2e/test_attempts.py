"""What the attempt object and the one attempt loop change for a user: a stream's verdict is
given when it ends, a continuation never keeps a probe's lease, a deployment's own request
timeout bounds its attempts, and upstream bookkeeping headers stay with the gateway."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import MESSAGES, chat, client, config, full, ordered, stream_chat
from tests.stack import Stack, deployment, group


def test_streams_that_break_after_their_first_token_open_the_breaker(stack: Stack) -> None:
    a = stack.sim("cut?after=1&tokens=20", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    api = client(gateway)
    breaker = gateway.router.targets["a"].breaker
    sent = 0
    while sent < 1000 and breaker.opened_count == 0:
        sent += 1
        with pytest.raises(openai.APIError):
            for _ in chat(api, stream=True):
                pass
    assert breaker.opened_count >= 1, f"{sent} streams broke and the breaker stayed closed"
    # The default breaker opens on ten failures in a row.
    assert sent == 10
    # Open, it is spared: twenty more streams reach it once at most (the early probe).
    before = len(stack.attempts(a))
    for _ in range(20):
        with pytest.raises(openai.APIError):
            for _ in chat(api, stream=True):
                pass
    assert len(stack.attempts(a)) - before <= 1


def test_a_diverged_continuation_takes_no_probe_permit_of_its_own(stack: Stack) -> None:
    """The continuation's stream is judged with the permit it was admitted with. Here the
    breaker moves to half-open while it runs (another client's failures opened it); when the
    regenerated answer turns out to differ, no probe may be taken on its behalf and kept."""
    a = stack.sim("cut?after=5&tokens=60", name="a")
    b = stack.sim("ok?tokens=3&delay=0.3", name="b")  # agrees at first, then ends too soon
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b)),
            routing={"breaker": {"probe_timeout": 30}},
        )
    )
    breaker = gateway.router.targets["b"].breaker
    outcome: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in chat(client(gateway), stream=True):
                pass
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 5
    while not stack.attempts(b) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stack.attempts(b), "no continuation started"

    async def reopen() -> None:
        breaker.force_open(0.01)

    stack.thread.run(reopen())
    time.sleep(0.05)
    assert breaker.state.value == "half_open"
    thread.join(10)
    assert outcome and isinstance(outcome[0], openai.APIError)
    assert "upstream_stream_cut" in str(outcome[0].body)  # the original fault is reported
    snapshot = breaker.snapshot()
    assert snapshot["probes_in_flight"] == 0
    assert snapshot["retry_after"] == 0.0  # the next request may probe at once


def test_a_deployments_own_request_timeout_bounds_a_whole_answer(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok?tokens=4", name="b")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a, timeouts={"request": 0.4}), deployment("b", b)),
            timeouts={"answer": 5.0},
        )
    )
    started = time.monotonic()
    reply = chat(client(gateway))
    took = time.monotonic() - started
    assert reply.choices[0].message.content == full(4)
    assert reply.system_fingerprint == "sim:b"
    assert 0.35 <= took < 1.5, took


def test_a_deployments_own_request_timeout_bounds_a_stream(stack: Stack) -> None:
    a = stack.sim("ok?tokens=60&delay=0.05", name="a")  # 3 s in all, never silent for long
    b = stack.sim("ok?tokens=60", name="b")
    gateway = stack.gateway(
        config(
            ordered(
                "chat",
                deployment("a", a, timeouts={"request": 1.0}),
                deployment("b", b, supports_prefill=True),
            )
        )
    )
    started = time.monotonic()
    text, who, finish = stream_chat(client(gateway))
    took = time.monotonic() - started
    assert (text, who, finish) == (full(60), "a", "stop")
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is True
    assert 0.9 <= took < 2.5, took


def _raw(url: str, body: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    import json

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_request_ids_and_quota_headers_stay_with_the_gateway(
    stack: Stack, stream: bool
) -> None:
    a = stack.sim("ok?tokens=3", name="a")
    plain = stack.gateway(config(group("chat", deployment("a", a))))
    body = {"model": "chat", "messages": MESSAGES, "stream": stream}
    headers, _ = _raw(plain.url + "/v1/chat/completions", body)
    assert not [h for h in headers if h.startswith("x-ratelimit-")]
    assert not headers["x-request-id"].startswith("req_")  # Ballast's own id, not OpenAI's
    assert headers["openai-processing-ms"] == "1"  # allowlisted by default
    assert "x-sim-name" not in headers

    listed = stack.gateway(
        config(
            group("chat", deployment("a", a)),
            upstream={"expose_headers": ["x-ratelimit-*", "x-sim-name"]},
        )
    )
    headers, _ = _raw(listed.url + "/v1/chat/completions", body)
    assert headers["x-ratelimit-remaining-requests"] == "9999"
    assert headers["x-sim-name"] == "a"
    assert not headers["x-request-id"].startswith("req_")

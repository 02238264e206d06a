"""Agent traffic at its real length, with the default keep-alive: tool-call and reasoning
deltas one a second for 15 s, and a model that thinks for 70 s before its first token.
The three run at once on one gateway, so the suite waits 70 s for all of them."""

from __future__ import annotations

import http.client
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from tests.e2e.test_agents import arguments, tool_stream
from tests.e2e.test_routing import MESSAGES, client, full, stream_chat
from tests.stack import Gateway, Stack, deployment, group

THINKING = 70.0  # seconds of silence before the first token, past a load balancer's 60


def timed_raw_stream(gateway: Gateway, model: str) -> tuple[int, list[tuple[float, bytes]]]:
    """(status, [(seconds since the request, bytes)]) for one streamed request, read as the
    bytes arrive, so the keep-alive comments' timing shows."""
    parts = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=THINKING + 30)  # type: ignore[arg-type]
    body = json.dumps({"model": model, "messages": MESSAGES, "stream": True})
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = conn.getresponse()
    pieces: list[tuple[float, bytes]] = []
    while piece := response.read1(65536):
        pieces.append((time.monotonic() - started, piece))
    conn.close()
    return response.status, pieces


def test_agent_streams_at_full_length_with_the_default_keepalive(stack: Stack) -> None:
    tools = stack.sim("ok?shape=tool&tokens=15&delay=1", name="tools")
    thinking = stack.sim("ok?shape=reasoning&tokens=15&delay=1", name="thinking")
    slow = stack.sim(f"slow_first?delay={THINKING:g}&tokens=4", name="slow")
    slow_sdk = stack.sim(f"slow_first?delay={THINKING:g}&tokens=4", name="slow_sdk")
    ten = {"first_token": 10, "inter_chunk": 5, "request": 120}
    patient = {"first_token": 120, "inter_chunk": 5, "answer": 200, "request": 200}
    gateway = stack.gateway(
        {
            "models": [
                group("tools", deployment("tools", tools, timeouts=ten)),
                group("thinking", deployment("thinking", thinking, timeouts=ten)),
                group("slow", deployment("slow", slow, timeouts=patient)),
                group("slow_sdk", deployment("slow_sdk", slow_sdk, timeouts=patient)),
            ]
        }
    )
    api = client(gateway, timeout=THINKING + 60)
    with ThreadPoolExecutor(4) as pool:
        tool_run = pool.submit(lambda: tool_stream(api, "tools"))
        thinking_run = pool.submit(lambda: tool_stream(api, "thinking"))
        raw_run = pool.submit(timed_raw_stream, gateway, "slow")
        sdk_run = pool.submit(stream_chat, api, "slow_sdk")
        results: dict[str, Any] = {
            "tools": tool_run.result(),
            "thinking": thinking_run.result(),
        }
        status, pieces = raw_run.result()
        sdk_text, sdk_who, sdk_finish = sdk_run.result()

    # Tool calls and reasoning: each of the 15 deltas reaches the client as it is sent.
    for name, (arrivals, calls, finish) in results.items():
        (attempt,) = stack.attempts(tools if name == "tools" else thinking)
        lags = [a - s for a, s in zip(arrivals, attempt["sent"], strict=True)]
        assert len(lags) == 15, (name, lags)
        assert lags[0] < 0.05, (name, lags)
        assert max(lags) < 0.25, (name, lags)
        if name == "tools":
            assert finish == "tool_calls" and calls[0]["arguments"] == arguments(15)
        else:
            assert finish == "stop"
            assert calls[-1]["reasoning"] == "".join(f"tok{i} " for i in range(15))

    # 70 s of thinking: the response starts at the first keep-alive (15 s by default), then
    # a comment every 15 s keeps any proxy in front from cutting an idle connection.
    assert status == 200
    comments = [at for at, piece in pieces if piece.startswith(b": keep-alive")]
    assert len(comments) == 4, pieces  # at 15, 30, 45 and 60 s
    assert 14 <= comments[0] <= 17, comments
    assert all(13 <= b - a <= 17 for a, b in itertools.pairwise(comments))
    assert pieces[-1][0] >= THINKING - 1
    body = b"".join(piece for _, piece in pieces)
    assert body.rstrip().endswith(b"data: [DONE]")
    assert b"tok3" in body
    # The official SDK ignores the comments and gets the whole answer.
    assert (sdk_text, sdk_who, sdk_finish) == (full(4), "slow_sdk", "stop")

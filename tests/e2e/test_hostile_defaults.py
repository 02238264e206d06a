"""Hostile upstreams against the default limits (32 MB a whole answer, 4 MB an event), on
every shape a client may ask in (chat; messages and responses, bridged and native): each
answer is cut at its limit, the memory it took is bounded while it happens and returned
after, the next request is answered at once, and the error names the limit's value.

The gateway's peak is read from /proc (`VmHWM`, reset before each hostile request), so no
sampling can miss it."""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_routing import MESSAGES, config, ordered
from tests.hostile import (
    MB,
    HostileUpstream,
    gateway_process,
    gzip_bomb,
    hostile_upstream,
    peak,
    rss,
)
from tests.hostile import reset_peak as reset
from tests.stack import Stack, deployment, wait_for

ANSWER = "max_response_bytes (33554432 bytes)"
EVENT = "max_event_bytes (4194304 bytes)"
# (hostile mode, stream asked, the limit the error names)
ROWS = [("huge", False, ANSWER), ("big_bomb", False, ANSWER), ("long_line", True, EVENT)]
# (route, the deployment's provider, how /v1/responses is served)
WAYS = {
    "chat": ("/v1/chat/completions", "openai", None),
    "messages-bridged": ("/v1/messages", "openai", None),
    "messages-native": ("/v1/messages", "anthropic", None),
    "responses-bridged": ("/v1/responses", "openai", "bridge"),
    "responses-native": ("/v1/responses", "openai", "native"),
}


def _config(upstream: HostileUpstream, provider: str, responses: str | None) -> dict[str, Any]:
    def hostile(mode: str) -> dict[str, Any]:
        dep: dict[str, Any] = {"id": mode, "url": upstream.url(mode), "api_key": "sk-h"}
        dep.update(provider=provider, probe="none", model="m")
        if responses is not None:
            dep["responses"] = responses
        return ordered(mode, dep)

    return config(
        *(hostile(mode) for mode, _, _ in ROWS),
        # Room for a loaded machine: what is measured is memory, not the hostile side's pace.
        timeouts={"first_token": 30.0, "answer": 40.0, "inter_chunk": 20.0},
        routing={"max_attempts": 1},
    )


def _ask(path: str, model: str, stream: bool) -> dict[str, Any]:
    if path.endswith("/responses"):
        return {"model": model, "input": "hi", "stream": stream}
    body: dict[str, Any] = {"model": model, "messages": MESSAGES, "stream": stream}
    if path.endswith("/messages"):
        body["max_tokens"] = 10
    return body


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def _error(body: bytes) -> str:
    """The message of an error, whole (JSON) or as a stream's error event."""
    text = body.decode(errors="replace")
    if body.lstrip().startswith(b"{"):
        return str(json.loads(body)["error"]["message"])
    return text


def _returned(pid: int, baseline: int) -> bool:
    return rss(pid) - baseline < 20 * MB


def _normal(port: int, sim_model: str) -> float:
    start = time.monotonic()
    status, _ = post(f"http://127.0.0.1:{port}/v1/chat/completions", _ask("/", sim_model, False))
    assert status == 200
    return time.monotonic() - start


@pytest.mark.parametrize("way", list(WAYS))
def test_hostile_answers_cost_bounded_memory_on_the_defaults(
    stack: Stack, tmp_path: Path, way: str
) -> None:
    gzip_bomb(1024)  # made once, before any upstream's loop would block a few seconds on it
    path, provider, responses = WAYS[way]
    upstream = hostile_upstream(stack)
    sim = stack.sim("ok?tokens=5")
    settings = _config(upstream, provider, responses)
    settings["models"].append(ordered("ok", deployment("ok", sim, "m")))
    with gateway_process(tmp_path, settings) as (pid, port):
        for _ in range(20):
            _normal(port, "ok")
        for mode, stream, limit in ROWS:
            baseline = rss(pid)
            reset(pid)
            status, body = post(f"http://127.0.0.1:{port}{path}", _ask(path, mode, stream))
            high = peak(pid) - baseline
            assert limit in _error(body), (mode, status, body[:300])
            assert status in (500, 502), (mode, body[:300])  # Anthropic's api_error is 500
            assert high < 100 * MB, (mode, high // MB)
            wait_for(functools.partial(_returned, pid, baseline), timeout=3.0)
            assert _normal(port, "ok") < 2.0

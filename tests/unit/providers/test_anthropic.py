"""A Messages request to a deployment that serves it natively: the client's bytes with only
the model name rewritten, the client's version and betas beside the deployment's own, and
an answer read as it came."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.providers.anthropic import AnthropicAdapter
from ballast.providers.base import AdapterContext
from ballast.upstream.client import Upstream

RAW = b'{"model": "claude", "max_tokens": 5, "messages": [], "thinking": {"type": "adaptive"}}'


class _Call:
    path = "/messages"
    raw = RAW
    model = "claude"
    credential = "c"
    request_id = None
    bridge = None
    extended = False

    def __init__(
        self, edits: dict[str, Any] | None = None, forwarded: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.payload = orjson.loads(RAW)
        self.edits = edits or {}
        self.forwarded = forwarded


def _adapter(**extra: Any) -> AnthropicAdapter:
    deployment = Deployment(id="a", url="https://api.anthropic.com", provider="anthropic", **extra)
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    return AnthropicAdapter(deployment, upstream, AdapterContext())


def _lines(headers: bytes) -> dict[str, str]:
    pairs = [line.split(": ", 1) for line in headers.decode().split("\r\n") if line]
    return {name: value for name, value in pairs}


def test_the_client_bytes_go_as_they_came_but_for_the_model_name() -> None:
    assert _adapter().body(_Call(), "claude") == RAW
    renamed = orjson.loads(_adapter(model="claude-sonnet-4").body(_Call(), "claude"))
    assert renamed == {**orjson.loads(RAW), "model": "claude-sonnet-4"}
    edited = orjson.loads(_adapter().body(_Call({"fallbacks": None}), "claude"))
    assert edited == orjson.loads(RAW)


def test_the_client_version_and_betas_go_beside_the_deployment_own() -> None:
    adapter = _adapter(api_key="sk-ant", anthropic={"beta": "files-api-2025-04-14"})
    call = _Call(forwarded=(("anthropic-version", "2023-06-01"), ("anthropic-beta", "b1,b2")))
    wire = adapter.wire(call, "claude", RAW, True)
    assert wire.target == "/v1/messages"
    headers = _lines(wire.headers)
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "b1,b2,files-api-2025-04-14"
    assert headers["x-api-key"] == "sk-ant"  # the deployment's key, never the client's
    assert adapter.wire(call, "claude", RAW, True).headers == wire.headers
    answer = b'{"type": "message", "content": [{"type": "thinking", "signature": "s"}]}'
    assert wire.answer(answer)[0] == answer  # the provider's own bytes


def test_a_header_the_deployment_configures_wins() -> None:
    adapter = _adapter(headers={"anthropic-beta": "pinned"})
    call = _Call(forwarded=(("anthropic-beta", "client"),))
    assert "anthropic-beta" not in _lines(adapter.wire(call, "claude", RAW, True).headers)


def test_the_count_goes_to_the_providers_own_endpoint_with_the_same_headers() -> None:
    adapter = _adapter(api_key="sk-ant")
    call = _Call(forwarded=(("anthropic-beta", "b1"),))
    wire = adapter.count_wire(call)
    assert wire is not None and wire.target == "/v1/messages/count_tokens"
    assert wire.headers == adapter.wire(call, "claude", RAW, False).headers
    rooted = Deployment(id="v", url="https://proxy.example/v1", provider="anthropic")
    upstream = Upstream(rooted, Timeouts(), UpstreamSettings())
    counted = AnthropicAdapter(rooted, upstream, AdapterContext()).count_wire(call)
    assert counted is not None and counted.target == "/messages/count_tokens"
    assert _adapter(messages="bridge").count_wire(call) is None  # bridged: no count of its own

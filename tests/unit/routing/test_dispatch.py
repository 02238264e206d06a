"""What each deployment of a group mixing ways is sent for one Messages request: the client's
body to a native Anthropic deployment, the chat form with its cache marks and thinking to a
bridged one, the plain chat form to one that carries neither, and the edits of the request
(a whole answer asked for as a stream) to every form alike."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson

from ballast.api.messages.shape import MessagesShape
from ballast.config import ModelGroup, Timeouts, UpstreamSettings, parse_settings
from ballast.providers import ADAPTERS, AdapterContext
from ballast.providers.base import Adapter
from ballast.routing.attempt import Attempt
from ballast.routing.dispatch import as_stream, request_for
from ballast.upstream.client import Upstream

MARK = {"type": "ephemeral"}
BODY = orjson.dumps(
    {
        "model": "claude",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s", "cache_control": MARK}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "c2ln"},
                    {"type": "text", "text": "ok"},
                ],
            },
            {"role": "user", "content": "more"},
        ],
    }
)
DEPLOYMENTS: list[dict[str, Any]] = [
    {"id": "native", "url": "http://n", "provider": "anthropic", "model": "m"},
    {
        "id": "bridged",
        "url": "http://b",
        "provider": "anthropic",
        "messages": "bridge",
        "model": "m",
    },
    {"id": "chat", "url": "http://c/v1", "model": "m"},
    {"id": "gemini", "url": "http://g", "provider": "gemini", "api_key": "k", "model": "m"},
]


def _group(*names: str) -> tuple[MessagesShape, ModelGroup, dict[str, Adapter]]:
    """A Messages shape over one group of the named deployments, and their adapters."""
    chosen = [d for d in DEPLOYMENTS if d["id"] in names]
    group = parse_settings({"models": [{"name": "claude", "deployments": chosen}]}).models[0]
    adapters = {}
    for deployment in group.deployments:
        upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
        adapters[deployment.id] = ADAPTERS[deployment.provider](
            deployment, upstream, AdapterContext()
        )
    return MessagesShape({"claude": group}.get), group, adapters


def _on(adapter: Adapter) -> Attempt:
    return cast(Attempt, SimpleNamespace(target=SimpleNamespace(adapter=adapter), deadline=9.0))


def _sent(call: Any, adapters: dict[str, Adapter]) -> dict[str, tuple[str, Any]]:
    """(path, body) each deployment is sent for `call`, streamed."""
    out = {}
    for name, adapter in adapters.items():
        request = request_for(_on(adapter), call, "claude", True)
        out[name] = (request.path, request.body)
    return out


def _plain(body: bytes) -> dict[str, Any]:
    assert b"cache_control" not in body and b"thinking" not in body and b"c2ln" not in body
    return cast(dict[str, Any], orjson.loads(body))


def test_each_deployment_of_a_mixed_group_takes_the_form_it_can_say() -> None:
    shape, group, adapters = _group("native", "bridged", "chat", "gemini")
    streamed = orjson.dumps({**orjson.loads(BODY), "stream": True})
    ctx = shape.parse("/messages", streamed)
    shape.bind(ctx, group)
    assert ctx.dropped == ("cache_control", "thinking")  # the chat deployments would lose them
    sent = _sent(ctx, adapters)
    path, body = sent["native"]  # the client's own body, its model renamed
    assert path == "/messages" and orjson.loads(body) == {**orjson.loads(streamed), "model": "m"}
    path, body = sent["bridged"]
    bridged = orjson.loads(body)
    assert path == "/chat/completions" and bridged["stream"] is True
    assert bridged["system"] == [{"type": "text", "text": "s", "cache_control": MARK}]
    assert bridged["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert bridged["messages"][1]["content"][0]["signature"] == "c2ln"
    assert sent["gemini"][0] == "/chat/completions"
    _plain(sent["gemini"][1])
    chat = _plain(sent["chat"][1])
    assert chat["messages"][0] == {"role": "system", "content": "s"} and chat["stream"] is True


def test_a_whole_answer_asked_for_as_a_stream_is_asked_so_in_every_form() -> None:
    shape, group, adapters = _group("bridged", "chat")
    ctx = shape.parse("/messages", BODY)
    shape.bind(ctx, group)
    assert ctx.extended and ctx.bridge is not None and ctx.bridge.edits is ctx.edits
    sent = _sent(as_stream(ctx), adapters)
    assert orjson.loads(sent["bridged"][1])["stream"] is True
    chat = _plain(sent["chat"][1])
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    # An Anthropic group alone: one form, nothing lost.
    shape, group, adapters = _group("bridged")
    ctx = shape.parse("/messages", BODY)
    shape.bind(ctx, group)
    assert ctx.extended and ctx.bridge is None and ctx.dropped == ()

"""Which way a Messages request is served (native, bridged or both, from the deployments
that may answer it), and how the translator carries a native stream: as the upstream sent
it, even when it follows a keep-alive in a group that also bridges."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
import pytest

from ballast.api.messages.shape import MessagesShape
from ballast.api.messages.stream import MessagesStream, NativeStream
from ballast.config import Deployment, parse_settings
from ballast.pipeline.errors import ApiError
from ballast.stream.event import DONE_EVENT, StreamEvent, events_of

BODY = orjson.dumps(
    {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "fallbacks": ["x"],
    }
)


@pytest.mark.parametrize(
    ("extra", "way"),
    [
        ({"provider": "anthropic"}, "native"),
        ({"provider": "anthropic", "messages": "bridge"}, "bridge"),
        ({}, "bridge"),
        ({"provider": "bedrock", "aws": {"region": "us-east-1"}}, "bridge"),
    ],
)
def test_the_way_a_deployment_serves_messages(extra: dict[str, Any], way: str) -> None:
    assert Deployment(id="d", url="http://x", **extra).messages_mode == way


def test_only_an_anthropic_deployment_can_be_native() -> None:
    with pytest.raises(pydantic.ValidationError, match="needs provider: anthropic"):
        Deployment(id="d", url="http://x/v1", messages="native")


def _settings() -> Any:
    native = {"provider": "anthropic"}
    return parse_settings(
        {
            "models": [
                {"name": "n", "deployments": [{"id": "a", "url": "http://a", **native}]},
                {"name": "b", "deployments": [{"id": "b", "url": "http://b/v1"}]},
                {
                    "name": "mixed",
                    "deployments": [
                        {"id": "c", "url": "http://c", **native},
                        {"id": "d", "url": "http://d/v1"},
                    ],
                },
            ]
        }
    )


def test_native_bridged_and_mixed_requests() -> None:
    groups = {g.name: g for g in _settings().models}
    shape = MessagesShape(groups.get)

    native = shape.parse("/messages", BODY)
    shape.bind(native, groups["n"])
    assert native.native and native.bridge is None and native.path == "/messages"
    assert native.edits == {"fallbacks": None}  # Ballast's own field stays with Ballast
    assert native.dropped == ()

    bridged = shape.parse("/messages", BODY)
    shape.bind(bridged, groups["b"])
    assert not bridged.native and bridged.path == "/chat/completions"
    assert "fallbacks" not in bridged.payload and bridged.dropped == ("thinking",)

    mixed = shape.parse("/messages", BODY)
    shape.bind(mixed, groups["mixed"])
    assert mixed.native and mixed.bridge is not None
    assert mixed.bridge.path == "/chat/completions" and mixed.dropped == ("thinking",)


def test_a_bad_body_is_refused_in_anthropic_terms() -> None:
    with pytest.raises(ApiError, match="model"):
        MessagesShape().parse("/messages", b'{"max_tokens": 1}')
    with pytest.raises(ApiError, match="stream"):
        MessagesShape().parse("/messages", b'{"model": "m", "stream": "yes"}')


NATIVE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"signature_delta","signature":"c2ln"}}\n\n'
)


def test_native_events_pass_as_sent_and_a_break_is_an_anthropic_error_event() -> None:
    for translator in (NativeStream(), MessagesStream("m", None, 1)):
        keepalive = StreamEvent(b": keep-alive\n\n", None)
        out = translator.feed([keepalive, *events_of(NATIVE)])
        assert out == b": keep-alive\n\n" + NATIVE
        assert translator.finish() == b""
        ended = translator.fail(ApiError(502, "cut", "api_error"))
        assert ended.startswith(b"event: error\n") and b'"api_error"' in ended


def test_a_bridged_request_keeps_what_its_deployments_carry_and_names_what_one_cannot() -> None:
    anthropic = {"id": "a", "url": "http://a", "provider": "anthropic", "messages": "bridge"}
    bedrock = {"id": "b", "url": "http://b", "provider": "bedrock", "aws": {"region": "eu-west-1"}}
    settings = parse_settings({"models": [{"name": "m", "deployments": [anthropic, bedrock]}]})
    group = settings.models[0]
    shape = MessagesShape({"m": group}.get)
    ctx = shape.parse("/messages", BODY)
    shape.bind(ctx, group)
    # Both take the one chat form; Bedrock's translation leaves the thinking out.
    assert ctx.extended and ctx.bridge is None and ctx.dropped == ("thinking",)
    assert ctx.payload["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    plain = shape.parse("/messages", orjson.dumps({**orjson.loads(BODY), "thinking": None}))
    shape.bind(plain, group)  # nothing of either asked: the plain form, nothing lost
    assert not plain.extended and plain.dropped == ()


def test_a_native_stream_that_finished_without_its_message_stop_gets_it() -> None:
    # The upstream said its message_delta (the answer is whole) and closed: the exchange
    # marks that end with a [DONE] of its own, which a Messages client gets as message_stop.
    delta = (
        b'event: message_delta\ndata: {"type":"message_delta",'
        b'"delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}\n\n'
    )
    out = NativeStream().feed([*events_of(delta), DONE_EVENT])
    assert out == delta + b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

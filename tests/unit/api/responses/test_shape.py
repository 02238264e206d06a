"""Native Responses pass-through, piece by piece: which way a deployment serves by default,
how a relayed Responses stream is read (first output, its end, its usage), and how the
relay's own error becomes a numbered Responses event."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
import pytest

from ballast.api.responses.shape import NativeStream, ResponsesContext, ResponsesShape
from ballast.config import Deployment, parse_settings
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.stream.event import events_of
from ballast.stream.state import StreamState
from ballast.stream.usage import read


@pytest.mark.parametrize(
    ("url", "extra", "way"),
    [
        ("https://api.openai.com/v1", {}, "native"),
        ("https://me.openai.azure.com/openai/v1", {}, "native"),
        ("http://10.0.0.5:8000/v1", {}, "bridge"),
        ("https://api.openai.com/v1", {"responses": "bridge"}, "bridge"),
        ("http://10.0.0.5:8000/v1", {"provider": "vllm", "responses": "native"}, "native"),
        ("http://10.0.0.5:8000/v1", {"provider": "vllm"}, "bridge"),
    ],
)
def test_the_way_a_deployment_serves_responses(url: str, extra: dict[str, Any], way: str) -> None:
    assert Deployment(id="d", url=url, **extra).responses_mode == way


def test_the_actor_cannot_be_native_and_a_typo_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        Deployment(id="d", url="http://x/v1", provider="actor", responses="native")
    with pytest.raises(pydantic.ValidationError):
        Deployment(id="d", url="http://x/v1", responses="nativ")


def test_a_request_is_native_only_when_every_deployment_that_may_answer_is() -> None:
    native = {"responses": "native"}
    settings = parse_settings(
        {
            "models": [
                {"name": "n", "deployments": [{"id": "a", "url": "http://a/v1", **native}]},
                {"name": "b", "deployments": [{"id": "b", "url": "http://b/v1"}]},
                {
                    "name": "nb",
                    "fallbacks": ["b"],
                    "deployments": [{"id": "c", "url": "http://c/v1", **native}],
                },
            ]
        }
    )
    groups = {g.name: g for g in settings.models}
    shape = ResponsesShape(groups.get)

    def bound(body: bytes) -> RequestContext:
        ctx = shape.parse("/responses", body)
        shape.bind(ctx, groups[ctx.model])  # the way is decided once the group is known
        return ctx

    body = orjson.dumps({"model": "n", "input": "hi", "stream": True})
    passed = bound(body)
    assert isinstance(passed, ResponsesContext) and passed.native
    assert passed.path == "/responses" and passed.raw == body  # the client's bytes go on
    for model, fallbacks in (("b", None), ("nb", None), ("n", ["b"])):
        asked = {"model": model, "input": "hi", "fallbacks": fallbacks}
        ctx = bound(orjson.dumps(asked))
        assert ctx.path == "/chat/completions", model
        assert ctx.payload["messages"] == [{"role": "user", "content": "hi"}]


def _event(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "sequence_number": 0, **data}


def test_a_responses_stream_is_read_for_output_its_end_and_usage() -> None:
    state = StreamState()
    state.observe(_event("response.created", response={"id": "r"}))
    assert not state.output
    state.observe(_event("response.output_text.delta", delta="Hel"))
    assert state.output and state.content == "Hel" and not state.untracked
    state.observe(_event("response.function_call_arguments.delta", delta="{"))
    assert state.untracked  # not text a continuation could check
    usage = {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}
    state.observe(_event("response.completed", response={"id": "r", "usage": usage}))
    assert state.finished and state.done and state.usage == usage
    assert read(state.usage)[:2] == (3, 5)


def test_the_relays_error_becomes_a_numbered_responses_error_event() -> None:
    native = NativeStream()
    relayed = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":7,"delta":"x"}\n\n'  # noqa: E501
    assert native.feed(events_of(relayed)) == relayed
    assert native.feed(events_of(b": keep-alive\n\n")) == b": keep-alive\n\n"
    ended = native.fail(ApiError(502, "cut", "api_error", "upstream_stream_cut"))
    name, data = ended.rstrip(b"\n").split(b"\n")
    assert name == b"event: error"
    event = orjson.loads(data[6:])
    assert event == {
        "type": "error",
        "code": "upstream_stream_cut",
        "message": "cut",
        "param": None,
        "sequence_number": 8,
    }


def sse(payload: dict[str, Any]) -> bytes:
    name = str(payload["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def test_a_response_that_started_ends_failed_with_its_own_id_and_finished_items() -> None:
    native = NativeStream()
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    item = {"id": "rs_1", "type": "reasoning", "summary": []}
    relayed = [
        {"type": "response.created", "sequence_number": 0, "response": response},
        {
            "type": "response.output_item.done",
            "sequence_number": 1,
            "output_index": 0,
            "item": item,
        },
        {"type": "response.output_text.delta", "sequence_number": 2, "delta": "x"},
    ]
    native.feed(events_of(b"".join(sse(p) for p in relayed)))
    ended = native.fail(ApiError(502, "cut", "api_error", "upstream_stream_cut"))
    error, failed = events_of(ended)
    assert error.name == b"error" and error.json["sequence_number"] == 3
    assert failed.name == b"response.failed"
    assert failed.json == {
        "type": "response.failed",
        "sequence_number": 4,
        "response": {
            **response,
            "status": "failed",
            "error": {"code": "server_error", "message": "cut"},
            "output": [item],
        },
    }

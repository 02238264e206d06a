"""Chat <-> Bedrock Converse translation on plain dicts. Request bodies are checked against
botocore's own model of the Converse operation, so a body that passes here is one Bedrock
accepts; ConverseStream frames and errors become chat chunks or the taxonomy's failures."""

from __future__ import annotations

import base64
import copy
from typing import Any

import botocore.session
import orjson
import pytest
from botocore.validate import ParamValidator

from ballast.providers.bedrock_answer import ConverseStream, parse_error, whole
from ballast.providers.bedrock_request import converse_body
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.eventstream import Frame

IDS = ("chatcmpl-1", 1700000000, "anthropic.claude-3-haiku")
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
CALL = {"id": "tu_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":1}'}}


def _validate(body: dict[str, Any]) -> None:
    """botocore's validator, with image bytes as botocore takes them (raw, not base64)."""
    params = copy.deepcopy(body)
    for message in params["messages"]:
        for block in message["content"]:
            if "image" in block:
                source = block["image"]["source"]
                source["bytes"] = base64.b64decode(source["bytes"])
    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    shape = model.operation_model("Converse").input_shape
    report = ParamValidator().validate({"modelId": "m", **params}, shape)
    assert not report.has_errors(), report.generate_report()


def test_a_conversation_with_a_tool_round_trip_is_a_valid_converse_body() -> None:
    body = converse_body(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PIXEL}"},
                        },
                    ],
                },
                {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "tu_1", "content": '{"answer": "png"}'},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [TOOL],
            "tool_choice": "required",
            "max_tokens": 50,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["END"],
        }
    )
    _validate(body)
    assert body["system"] == [{"text": "Be brief."}]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"][1] == {
        "toolUse": {"toolUseId": "tu_1", "name": "lookup", "input": {"q": 1}}
    }
    result, thanks = body["messages"][2]["content"]
    assert result == {"toolResult": {"toolUseId": "tu_1", "content": [{"json": {"answer": "png"}}]}}
    assert thanks == {"text": "Thanks"}
    assert body["inferenceConfig"] == {
        "maxTokens": 50,
        "temperature": 0.5,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert body["toolConfig"]["toolChoice"] == {"any": {}}


def test_a_remote_image_url_is_unsupported_so_another_provider_may_answer() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    with pytest.raises(Failure) as caught:
        converse_body({"messages": [{"role": "user", "content": [image]}]})
    assert caught.value.kind is failures.UNSUPPORTED


def test_a_whole_answer_with_tool_use_becomes_tool_calls() -> None:
    data = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"text": "Looking"},
                    {"toolUse": {"toolUseId": "tu_9", "name": "lookup", "input": {"q": "x"}}},
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13},
    }
    answer = whole(data, IDS)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Looking"
    assert choice["message"]["tool_calls"][0]["id"] == "tu_9"
    assert answer["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}


def _event(name: str, payload: dict[str, Any]) -> Frame:
    headers = {":event-type": name, ":message-type": "event", ":content-type": "application/json"}
    return Frame(dict(headers), orjson.dumps(payload))


def test_a_converse_stream_becomes_chat_chunks() -> None:
    stream = ConverseStream(IDS)
    events = [
        _event("messageStart", {"role": "assistant"}),
        _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi "}}),
        _event("contentBlockStop", {"contentBlockIndex": 0}),
        _event(
            "contentBlockStart",
            {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t", "name": "f"}}},
        ),
        _event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a"'}}}
        ),
        _event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ":1}"}}}
        ),
        _event("contentBlockStop", {"contentBlockIndex": 1}),
        _event("messageStop", {"stopReason": "tool_use"}),
        _event("metadata", {"usage": {"inputTokens": 3, "outputTokens": 6}, "metrics": {}}),
    ]
    out = [c for e in events for c in stream.feed(e)] + stream.end(include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert deltas[1] == {"content": "Hi "}
    assert deltas[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:5])
    assert orjson.loads(arguments) == {"a": 1}
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["usage"]["total_tokens"] == 9


def test_an_exception_in_the_stream_is_a_failure_of_its_kind() -> None:
    stream = ConverseStream(IDS)
    frame = Frame(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"slow down"}',
    )
    with pytest.raises(Failure) as caught:
        stream.feed(frame)
    assert caught.value.kind is failures.RATE_LIMITED
    assert "slow down" in caught.value.message


def test_a_stream_without_message_stop_owes_no_closing_chunk() -> None:
    stream = ConverseStream(IDS)
    stream.feed(_event("messageStart", {"role": "assistant"}))
    assert not stream.finished
    assert stream.end(include_usage=True) == []  # the transport reports the cut


@pytest.mark.parametrize(
    ("status", "name", "message", "kind"),
    [
        (429, "ThrottlingException", "Too many requests", failures.RATE_LIMITED),
        (503, "ServiceUnavailableException", "try later", failures.SERVER_ERROR),
        (429, "ModelNotReadyException", "model is loading", failures.SERVER_ERROR),
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            failures.CONTEXT_LENGTH,
        ),
        (400, "ValidationException", "messages: field required", failures.CLIENT_ERROR),
        (403, "AccessDeniedException", "no access", failures.UPSTREAM_AUTH),
    ],
)
def test_bedrock_errors_map_to_the_taxonomy(
    status: int, name: str, message: str, kind: object
) -> None:
    headers = ((b"x-amzn-ErrorType", f"{name}:http://internal.amazon.com/".encode()),)
    failure = parse_error(status, orjson.dumps({"message": message}), headers)
    assert failure.kind is kind
    by_body = parse_error(
        status, orjson.dumps({"__type": f"com.amazon#{name}", "message": message})
    )
    assert by_body.kind is kind
    assert orjson.loads(failure.body or b"")["error"]["message"] == message

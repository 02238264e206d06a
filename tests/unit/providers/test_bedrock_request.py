"""A chat request as a Bedrock Converse body, checked against botocore's own model of the
Converse operation, so a body that passes here is one Bedrock accepts."""

from __future__ import annotations

import base64
import copy
from typing import Any

import botocore.session  # type: ignore[import-untyped]
import orjson
import pytest
from botocore.validate import ParamValidator  # type: ignore[import-untyped]

from ballast.providers.bedrock_request import converse_body
from ballast.resilience import failures
from ballast.resilience.failures import Failure

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


MARK = {"type": "ephemeral"}
POINT = {"cachePoint": {"type": "default"}}


def test_each_cache_mark_is_a_cache_point_after_what_it_marked() -> None:
    body = converse_body(
        {
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "s", "cache_control": MARK}],
                },
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": MARK}]},
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "b", "cache_control": MARK}],
                    "tool_calls": [{**CALL, "cache_control": MARK}],
                    "thinking_blocks": [{"type": "redacted_thinking", "data": "ZW5j"}],
                },
                {"role": "tool", "tool_call_id": "tu_1", "content": "r", "cache_control": MARK},
            ],
            "tools": [{**TOOL, "cache_control": MARK}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},  # not carried
        }
    )
    _validate(body)
    assert body["system"] == [{"text": "s"}, POINT]
    user, assistant, result = body["messages"]
    assert user["content"] == [{"text": "a"}, POINT]
    use = {"toolUse": {"toolUseId": "tu_1", "name": "lookup", "input": {"q": 1}}}
    assert assistant["content"] == [{"text": "b"}, POINT, use, POINT]
    assert result["content"][1:] == [POINT]
    assert body["toolConfig"]["tools"][1:] == [POINT]
    assert "thinking" not in orjson.dumps(body).decode()

"""A Responses request as the chat completion it means, or a 400 naming what cannot be
honoured or what is malformed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.api.responses.request import to_chat
from ballast.pipeline.errors import ApiError


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = to_chat(
        {"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 5}
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }


def test_items_become_messages_tool_calls_and_tool_results() -> None:
    chat = to_chat(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "rules"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                    ],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                },
            ],
        }
    )
    messages = chat["messages"]
    assert messages[0] == {"role": "system", "content": "rules"}
    assert messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
    }
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert messages[5] == {"role": "assistant", "content": "done"}


def test_tools_choice_format_reasoning_and_stream_are_translated() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = to_chat(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
            "reasoning": {"effort": "low", "summary": "auto"},
            "metadata": {"k": "v"},
            "store": False,
            "include": [],
            "stream": True,
        }
    )
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema},
    }
    assert chat["reasoning_effort"] == "low"
    assert chat["stream_options"] == {"include_usage": True}
    assert "metadata" not in chat and "store" not in chat  # kept by Ballast, not sent


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        to_chat({"model": "m", "input": "x", **extra})
    assert caught.value.status == 400
    assert caught.value.param == param
    assert orjson.loads(caught.value.body())["error"]["param"] == param


def test_what_only_shapes_the_answer_is_dropped_and_named_never_refused() -> None:
    dropped: list[str] = []
    chat = to_chat(
        {
            "model": "m",
            "input": [
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
                {"role": "user", "content": "x"},
            ],
            "include": ["reasoning.encrypted_content"],
            "truncation": "auto",
            "client_metadata": {"x-codex-installation-id": "i"},
            "context_management": [{"type": "compaction"}],
            "frobnicate": 1,
            "unset": None,
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "web_search"},
                {"type": "namespace", "name": "agents", "tools": []},
            ],
        },
        dropped,
    )
    assert chat["messages"] == [{"role": "user", "content": "x"}]
    assert [t["function"]["name"] for t in chat["tools"]] == ["f"]
    assert dropped == [
        "client_metadata",
        "frobnicate",
        "truncation",
        "include",
        "context_management",
        "input.reasoning",
        "tools.web_search",
        "tools.namespace",
    ]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"instructions": ["x"]}, "instructions"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
def test_malformed_requests_are_400s_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        to_chat({"model": "m", "input": "x", **extra})
    assert caught.value.status == 400 and caught.value.param == param

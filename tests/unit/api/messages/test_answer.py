"""A chat answer as a Message: content blocks, stop reasons and usage."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Usage

from ballast.api.messages.answer import message_body, message_id, usage_of


def answer(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": finish, **extra}
    return {
        "id": "chatcmpl-1",
        "model": "up",
        "choices": [choice],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }


def test_an_answer_with_reasoning_text_and_tool_calls() -> None:
    message = {
        "content": "hi",
        "reasoning_content": "think",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{broken"}},
        ],
    }
    body = message_body(answer(message, "tool_calls"), "claude", None)
    assert body["id"] == "msg_1" and body["model"] == "up"
    assert body["content"] == [
        {"type": "thinking", "thinking": "think", "signature": ""},
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "c2", "name": "g", "input": {"_arguments": "{broken"}},
    ]
    assert body["stop_reason"] == "tool_use"
    assert body["usage"] == {"input_tokens": 7, "output_tokens": 3}


@pytest.mark.parametrize(
    ("finish", "extra", "expected"),
    [
        ("stop", {}, ("end_turn", None)),
        ("length", {}, ("max_tokens", None)),
        ("content_filter", {}, ("refusal", None)),
        ("stop", {"stop_reason": "END"}, ("stop_sequence", "END")),  # vLLM names the match
        ("stop", {"stop_reason": 2}, ("end_turn", None)),  # an EOS token id
    ],
)
def test_stop_reasons(finish: str, extra: dict[str, Any], expected: tuple[str, Any]) -> None:
    body = message_body(answer({"content": "x"}, finish, **extra), "claude", ["END"])
    assert (body["stop_reason"], body["stop_sequence"]) == expected


def test_the_caches_reads_and_writes_are_counted_apart() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert usage_of(usage) == {
        "input_tokens": 6,
        "output_tokens": 2,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }
    assert usage_of(None, 5) == {"input_tokens": 5, "output_tokens": 0}
    assert usage_of({"prompt_tokens": 3, "completion_tokens": 1}) == {
        "input_tokens": 3,
        "output_tokens": 1,
    }
    # Writes (for an hour too) and reasoning, as a translated Anthropic answer reports them.
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 30,
        "prompt_tokens_details": {
            "cached_tokens": 20,
            "cache_write_tokens": 50,
            "cache_write_1h_tokens": 10,
        },
        "completion_tokens_details": {"reasoning_tokens": 25},
    }
    usage = usage_of(usage)
    assert usage == {
        "input_tokens": 30,
        "output_tokens": 30,
        "cache_read_input_tokens": 20,
        "cache_creation_input_tokens": 50,
        "cache_creation": {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 10},
        "output_tokens_details": {"thinking_tokens": 25},
    }
    assert Usage.model_validate(usage).cache_creation is not None  # the SDK's own type


def test_the_message_id_is_made_once() -> None:
    assert message_id("chatcmpl-abc") == "msg_abc"
    assert message_id("msg_01XYZ") == "msg_01XYZ"  # an Anthropic deployment's own, not msg_msg_
    assert message_id(None) == "msg_ballast"


SIGNED = {"type": "thinking", "thinking": "think", "signature": "c2ln"}
REDACTED = {"type": "redacted_thinking", "data": "ZW5j"}


def test_signed_thinking_comes_back_exactly_in_place_of_the_unsigned_reasoning() -> None:
    message = {
        "content": "hi",
        "reasoning_content": "think",
        "thinking_blocks": [REDACTED, SIGNED, {"type": "thinking", "thinking": "unsigned"}],
    }
    body = message_body(answer(message), "claude", None)
    assert body["content"] == [REDACTED, SIGNED, {"type": "text", "text": "hi"}]


def test_cache_writes_are_counted_apart_too() -> None:
    details = {"cached_tokens": 4, "cache_write_tokens": 3, "cache_write_1h_tokens": 2}
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": details}
    # `cache_write_tokens` counts every write; `cache_write_1h_tokens` the hour-long ones.
    assert usage_of(usage) == {
        "input_tokens": 3,
        "output_tokens": 2,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 4,
        "cache_creation": {"ephemeral_5m_input_tokens": 1, "ephemeral_1h_input_tokens": 2},
    }

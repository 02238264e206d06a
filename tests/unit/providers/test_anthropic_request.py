"""A chat request as an Anthropic Messages request, on plain data: what Messages can say is
said, a prefill is the final assistant turn, and what it cannot say is refused."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.providers.anthropic import AnthropicAdapter
from ballast.providers.anthropic_request import Untranslatable, messages_request
from ballast.providers.base import AdapterContext
from ballast.upstream.client import Upstream


def test_the_request_is_translated() -> None:
    payload: dict[str, Any] = {
        "model": "chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": "and kind"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {
                        "id": "t2",
                        "type": "function",
                        "function": {"name": "g", "arguments": '{"a":1}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "one"},
            {"role": "tool", "tool_call_id": "t2", "content": "two"},
        ],
        "stop": "END",
        "temperature": 0.5,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u-1",
    }
    out = messages_request(payload, "claude-x", 4096)
    assert out["model"] == "claude-x" and out["max_tokens"] == 4096 and out["stream"] is True
    assert out["system"] == "be brief\n\nand kind"
    user, assistant, results = out["messages"]
    assert user["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert user["content"][1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": "AAAA",
    }
    assert user["content"][2]["source"] == {"type": "url", "url": "https://example.com/a.png"}
    assert [b["input"] for b in assistant["content"]] == [{}, {"a": 1}]
    assert results["role"] == "user"  # both tool results in one user turn
    assert [b["tool_use_id"] for b in results["content"]] == ["t1", "t2"]
    assert out["stop_sequences"] == ["END"] and out["temperature"] == 0.5
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert out["tools"] == [
        {"name": "f", "input_schema": {"type": "object", "properties": {}}, "description": "d"}
    ]
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert out["metadata"] == {"user_id": "u-1"} and "stream_options" not in out


class _Call:
    path = "/chat/completions"
    raw = b""
    model = "chat"
    credential = "c"
    request_id = None
    forwarded: tuple[tuple[str, str], ...] = ()
    bridge = None
    extended = False

    def __init__(self, payload: dict[str, Any], edits: dict[str, Any] | None = None) -> None:
        self.payload = payload
        self.edits = edits or {}


def _adapter() -> AnthropicAdapter:
    deployment = Deployment(
        id="a", url="https://api.anthropic.com", model="m", provider="anthropic"
    )
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    return AnthropicAdapter(deployment, upstream, AdapterContext())


def test_a_prefill_is_a_final_assistant_turn_without_trailing_space() -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    out = orjson.loads(_adapter().body(_Call(payload), "chat", "tok0 tok1 "))
    assert out["max_tokens"] == 10 and out["model"] == "m"
    assert out["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "tok0 tok1"}],
    }


def test_edits_are_applied_once_before_translation_and_thinking_takes_no_prefill() -> None:
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "user": "u-1",
    }
    call = _Call(payload, {"max_tokens": 7, "user": None})
    out = orjson.loads(_adapter().body(call, "chat", "already said"))
    assert out["max_tokens"] == 7 and "metadata" not in out
    assert [m["role"] for m in out["messages"]] == ["user"]  # thinking: regenerated instead
    assert payload["user"] == "u-1"  # the client's payload is left as it came


MARK = {"type": "ephemeral"}
SIGNED = {"type": "thinking", "thinking": "hm", "signature": "c2ln"}
REDACTED = {"type": "redacted_thinking", "data": "ZW5j"}


def test_earlier_thinking_opens_its_turn_exactly_and_marks_stay_where_they_were() -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    payload: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "s", "cache_control": MARK}]},
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "calling", "cache_control": MARK}],
                "tool_calls": [{**call, "cache_control": MARK}],
                "thinking_blocks": [SIGNED, REDACTED],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "r", "cache_control": MARK},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    out = messages_request(payload, "m", 16)
    assert out["system"] == [{"type": "text", "text": "s", "cache_control": MARK}]
    assert out["thinking"] == payload["thinking"]
    _, assistant, results = out["messages"]
    assert assistant["content"] == [
        SIGNED,
        REDACTED,
        {"type": "text", "text": "calling", "cache_control": MARK},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}, "cache_control": MARK},
    ]
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "r", "cache_control": MARK}
    ]


@pytest.mark.parametrize(
    "blocks",
    [{"type": "thinking"}, [{"type": "thinking", "thinking": "t"}], [{"type": "text"}]],
)
def test_thinking_blocks_that_could_not_be_sent_back_exactly_are_refused(blocks: Any) -> None:
    message = {"role": "assistant", "content": "x", "thinking_blocks": blocks}
    with pytest.raises(Untranslatable, match="thinking"):
        messages_request({"messages": [{"role": "user", "content": "x"}, message]}, "m", 16)


@pytest.mark.parametrize(
    "payload",
    [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True},
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"},
        },
    ],
)
def test_what_messages_cannot_say_is_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(Untranslatable):
        messages_request(payload, "m", 16)

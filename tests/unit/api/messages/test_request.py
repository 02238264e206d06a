"""A Messages request as the chat completion it means, or a 400 naming the field: by example,
then fuzzed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.api.messages.errors import render
from ballast.api.messages.request import to_chat
from ballast.api.messages.shape import MESSAGES
from ballast.pipeline.errors import ApiError

BASE: dict[str, Any] = {"model": "claude", "max_tokens": 10}


def chat_of(**fields: Any) -> dict[str, Any]:
    return to_chat({**BASE, **fields})


def test_system_blocks_and_plain_fields() -> None:
    chat = chat_of(
        system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {}}],
        messages=[{"role": "user", "content": "hi"}],
        stop_sequences=["END"],
        temperature=0.2,
        top_k=3,
        metadata={"user_id": "u1"},
        stream=True,
    )
    assert chat == {
        "model": "claude",
        "messages": [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 0.2,
        "stop": ["END"],
        "user": "u1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_images_become_image_url_parts() -> None:
    chat = chat_of(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    {"type": "text", "text": "what?"},
                ],
            }
        ]
    )
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
        {"type": "text", "text": "what?"},
    ]


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages() -> None:
    chat = chat_of(
        tools=[{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=[
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "r1"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "bad",
                        "is_error": True,
                    },
                ],
            },
        ],
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["messages"][1:] == [
        {  # the thinking block of an earlier turn is not sent back
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "r1"},  # tool results come first
        {"role": "tool", "tool_call_id": "t2", "content": "Error: bad"},
        {"role": "user", "content": "and"},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    assert (
        chat_of(messages=[{"role": "user", "content": "x"}], tool_choice=choice)["tool_choice"]
        == expected
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": 3}, "model"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}
                ]
            },
            "messages.0.content.0.source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0.type",
        ),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": 5}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"system": [{"type": "image"}]}, "system.0.type"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(fields: dict[str, Any], named: str) -> None:
    payload = {**BASE, "messages": [{"role": "user", "content": "x"}], **fields}
    with pytest.raises(ApiError) as info:
        to_chat(payload)
    assert info.value.status == 400 and info.value.param == named
    status, body = render(info.value)
    error = orjson.loads(body)
    assert status == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(named + ":")


def test_what_a_chat_completion_cannot_carry_is_dropped_and_named_never_refused() -> None:
    dropped: list[str] = []
    payload = {
        **BASE,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "text", "text": "ok"},
                ],
            },
            {"role": "user", "content": "go on"},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "mcp_servers": [{"type": "url", "url": "https://m"}],
        "container": "c1",
        "top_k": 3,
        "output_config": {"effort": "high"},
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "a new field\r\n": 1,  # a name unfit for a header is named `other`
        "service_tier": None,  # a field given as null asks for nothing
    }
    chat = to_chat(payload, dropped=dropped)
    assert chat["messages"][-2] == {"role": "assistant", "content": "ok"}
    assert "tools" not in chat
    assert dropped == [
        "cache_control",
        "thinking",
        "redacted_thinking",
        "other",
        "container",
        "context_management",
        "mcp_servers",
        "top_k",
        "tools.web_search_20250305",
        "output_config.effort",
    ]


MARK = {"type": "ephemeral"}
KEEP = frozenset(("cache_control", "thinking"))


def test_cache_marks_and_thinking_are_kept_where_asked_in_their_chat_places() -> None:
    signed = {"type": "thinking", "thinking": "t", "signature": "sig"}
    redacted = {"type": "redacted_thinking", "data": "ZW5j"}
    payload = {
        **BASE,
        "system": [
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b", "cache_control": MARK},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": MARK}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": MARK}]},
            {
                "role": "assistant",
                "content": [
                    signed,
                    redacted,
                    {"type": "text", "text": "calling"},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "f",
                        "input": {},
                        "cache_control": MARK,
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "r", "cache_control": MARK}],
                        "is_error": True,
                        "cache_control": MARK,
                    }
                ],
            },
        ],
    }
    dropped: list[str] = []
    kept: list[str] = []
    chat = to_chat(payload, dropped=dropped, keep=KEEP, kept=kept)
    assert dropped == [] and kept == ["cache_control", "thinking", "redacted_thinking"]
    assert chat["thinking"] == payload["thinking"]
    assert chat["tools"][0]["cache_control"] == MARK
    system, user, assistant, tool = chat["messages"]
    assert system["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b", "cache_control": MARK},
    ]
    assert user["content"] == [{"type": "text", "text": "go", "cache_control": MARK}]
    assert assistant["content"] == "calling" and assistant["thinking_blocks"] == [signed, redacted]
    assert assistant["tool_calls"][0]["cache_control"] == MARK
    assert tool == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": [{"type": "text", "text": "Error: r", "cache_control": MARK}],
        "cache_control": MARK,
    }
    # Only the marks asked for: thinking left out and named, the marks kept.
    dropped, kept = [], []
    chat = to_chat(payload, dropped=dropped, keep=frozenset(("cache_control",)), kept=kept)
    assert dropped == ["thinking", "redacted_thinking"] and kept == ["cache_control"]
    assert "thinking" not in chat and "thinking_blocks" not in chat["messages"][2]
    # None asked: the plain chat form, as a chat upstream takes it.
    assert orjson.dumps(to_chat(payload)).find(b"cache_control") == -1


@pytest.mark.parametrize(
    ("block", "named"),
    [
        ({"type": "thinking", "thinking": "t"}, "messages.1.content.0.signature"),
        ({"type": "thinking", "signature": "s"}, "messages.1.content.0.thinking"),
        ({"type": "redacted_thinking"}, "messages.1.content.0.data"),
    ],
)
def test_a_thinking_block_that_could_not_go_back_exactly_is_a_400(
    block: dict[str, Any], named: str
) -> None:
    turns = [{"role": "user", "content": "x"}, {"role": "assistant", "content": [block]}]
    for keep in (KEEP, frozenset()):  # the same answer whoever would get it
        with pytest.raises(ApiError) as info:
            to_chat({**BASE, "messages": turns}, keep=keep)
        assert info.value.param == named


def test_count_tokens_needs_no_max_tokens_and_the_shape_parses_to_chat_terms() -> None:
    assert "max_tokens" not in to_chat({"model": "m", "messages": []}, counting=True)
    body = orjson.dumps(
        {**BASE, "messages": [{"role": "user", "content": "x"}], "fallbacks": ["b"]}
    )
    ctx = MESSAGES.context(body, counting=False)
    assert ctx.path == "/chat/completions" and ctx.fallbacks == ("b",)
    assert orjson.loads(ctx.raw) == ctx.payload and "fallbacks" not in ctx.payload
    with pytest.raises(ApiError):
        MESSAGES.parse("/messages", b"{not json")


# -- hostile input, fuzzed ---------------------------------------------------------------

FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
leaves = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "text", "source", "content", "id", "name", "input", "role"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=15,
)
block_types = st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "x"])
blocks = st.fixed_dictionaries({"type": block_types}, optional={"text": json_values})
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "x"])},
        optional={"content": st.text(max_size=5) | st.lists(blocks | json_values, max_size=3)},
    ),
    max_size=3,
)
TOP = ["system", "tools", "tool_choice", "stop_sequences", "metadata", "stream", "max_tokens"]


@FAST
@given(messages, st.dictionaries(st.sampled_from(TOP), json_values, max_size=4))
def test_any_messages_body_translates_or_is_a_400(given_messages: Any, extra: Any) -> None:
    body = orjson.dumps({**BASE, "messages": given_messages, **extra})
    try:
        ctx = MESSAGES.context(body, counting=False)
    except ApiError as error:
        assert error.status == 400 and error.param
        return
    assert orjson.loads(ctx.raw)["model"] == "claude"

"""The Messages shape's translation: a request into a chat completion, a chat answer into a
Message, and the stream state machine from chat chunks to Anthropic's events."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.api.messages.answer import message_body, usage_of
from ballast.api.messages.errors import passthrough, render
from ballast.api.messages.request import to_chat
from ballast.api.messages.shape import MESSAGES
from ballast.api.messages.stream import MessagesStream, State
from ballast.pipeline.errors import ApiError

BASE: dict[str, Any] = {"model": "claude", "max_tokens": 10}


def chat_of(**fields: Any) -> dict[str, Any]:
    return to_chat({**BASE, **fields})


# -- the request -----------------------------------------------------------------------


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
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
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
        ({"tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools.0.type"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": 5}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"mcp_servers": [{}]}, "mcp_servers"),
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


def test_count_tokens_needs_no_max_tokens_and_the_shape_parses_to_chat_terms() -> None:
    assert "max_tokens" not in to_chat({"model": "m", "messages": []}, counting=True)
    body = orjson.dumps(
        {**BASE, "messages": [{"role": "user", "content": "x"}], "fallbacks": ["b"]}
    )
    ctx = MESSAGES.parse("/chat/completions", body)
    assert ctx.path == "/chat/completions" and ctx.fallbacks == ("b",)
    assert orjson.loads(ctx.raw) == ctx.payload and "fallbacks" not in ctx.payload
    with pytest.raises(ApiError):
        MESSAGES.parse("/chat/completions", b"{not json")


# -- the whole answer --------------------------------------------------------------------


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


def test_cached_prompt_tokens_are_counted_apart() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert usage_of(usage) == {"input_tokens": 6, "output_tokens": 2, "cache_read_input_tokens": 4}
    assert usage_of(None, 5) == {"input_tokens": 5, "output_tokens": 0}


def test_passthrough_keeps_the_upstreams_message_and_maps_the_status() -> None:
    body = orjson.dumps({"error": {"message": "too long", "type": "invalid_request_error"}})
    status, out = passthrough(400, body)
    assert status == 400
    assert orjson.loads(out) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too long"},
    }
    status, out = passthrough(409, b"<html>")
    assert status == 409 and b"status 409" in out


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, (401, "authentication_error")), (403, (403, "permission_error")),
     (404, (404, "not_found_error")), (429, (429, "rate_limit_error")),
     (502, (500, "api_error")), (503, (529, "overloaded_error")), (504, (504, "timeout_error"))],
)  # fmt: skip
def test_error_statuses(status: int, expected: tuple[int, str]) -> None:
    out_status, body = render(ApiError(status, "m"))
    assert (out_status, orjson.loads(body)["error"]["type"]) == expected


# -- the stream --------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    payload = {"id": "chatcmpl-9", "model": "up", "choices": choices, **top}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for event in data.split(b"\n\n"):
        if event:
            name, data_line = event.split(b"\n")
            payload = orjson.loads(data_line.removeprefix(b"data: "))
            assert name == b"event: " + payload["type"].encode()
            out.append(payload)
    return out


def run(*pieces: bytes) -> tuple[MessagesStream, list[dict[str, Any]]]:
    stream = MessagesStream("claude", None, 42)
    out = b"".join(stream.feed(p) for p in pieces) + stream.finish()
    return stream, events(out)


def test_text_stream_in_order_with_usage_at_the_end() -> None:
    stream, out = run(
        b": keep-alive\n\n",
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "a"}) + chunk({"content": "b"}),
        chunk({}, "stop"),
        chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 2}) + DONE,
    )
    assert [e["type"] for e in out] == [
        "ping",
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = out[1]["message"]
    assert start["id"] == "msg_9" and start["model"] == "up"
    assert start["usage"] == {"input_tokens": 42, "output_tokens": 0}  # the estimate
    assert [e["delta"]["text"] for e in out[3:5]] == ["a", "b"]
    assert out[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert out[6]["usage"] == {"input_tokens": 5, "output_tokens": 2}  # the real counts
    assert stream.state is State.ENDED


def test_tool_arguments_split_across_chunks_are_input_json_deltas() -> None:
    first = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    _, out = run(
        chunk({"content": "let me"}),
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
        chunk(
            {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{}"}}]}
        ),
        chunk({}, "tool_calls") + DONE,
    )
    starts = [e for e in out if e["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
    ]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    parts = [
        e["delta"]["partial_json"]
        for e in out
        if e["type"] == "content_block_delta" and e["index"] == 1
    ]
    assert "".join(parts) == '{"q": "x"}' and len(parts) == 2
    stops = [e["index"] for e in out if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]  # each block closed before the next one opened
    assert out[-2]["delta"]["stop_reason"] == "tool_use"


def test_reasoning_then_text_are_two_blocks() -> None:
    _, out = run(
        chunk({"reasoning_content": "hm"}),
        chunk({"content": "yes"}),
        chunk({}, "length") + DONE,
    )
    starts = [e["content_block"]["type"] for e in out if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in out if e["type"] == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "hm"},
        {"type": "text_delta", "text": "yes"},
    ]
    assert out[-2]["delta"]["stop_reason"] == "max_tokens"


def test_the_relays_error_event_ends_the_stream_with_an_anthropic_error() -> None:
    error = {"error": {"message": "stalled", "type": "timeout", "code": "upstream_stalled"}}
    stream, out = run(chunk({"content": "a"}), b"data: " + orjson.dumps(error) + b"\n\n")
    assert out[-1] == {"type": "error", "error": {"type": "timeout_error", "message": "stalled"}}
    assert "message_stop" not in [e["type"] for e in out]
    assert stream.feed(chunk({"content": "late"})) == b""  # nothing after the end


@pytest.mark.parametrize("end", [DONE, b""], ids=["done", "closed"])
def test_a_stream_that_never_finished_is_an_error_not_a_success(end: bytes) -> None:
    _, out = run(chunk({"content": "half"}), end)
    assert out[-1]["type"] == "error" and out[-1]["error"]["type"] == "api_error"
    assert "message_stop" not in [e["type"] for e in out]


def test_a_finished_stream_without_done_is_closed_and_usage_from_the_first_chunk() -> None:
    first = chunk({"content": "a"}, usage={"prompt_tokens": 3, "completion_tokens": 1})
    _, out = run(first, chunk({}, "stop"))
    assert out[0]["message"]["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert [e["type"] for e in out][-2:] == ["message_delta", "message_stop"]


def test_malformed_chunks_and_comments_after_the_start_are_skipped() -> None:
    _, out = run(
        chunk({"content": "a"}), b"data: {nope\n\n: keep-alive\n\n", chunk({}, "stop") + DONE
    )
    assert "ping" not in [e["type"] for e in out]
    assert [e["delta"]["text"] for e in out if e["type"] == "content_block_delta"] == ["a"]


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
        ctx = MESSAGES.parse("/chat/completions", body)
    except ApiError as error:
        assert error.status == 400 and error.param
        return
    assert orjson.loads(ctx.raw)["model"] == "claude"


deltas = st.fixed_dictionaries(
    {},
    optional={
        "content": st.text(max_size=4) | st.none(),
        "reasoning_content": st.text(max_size=4),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 2)},
                optional={
                    "id": st.text(max_size=3),
                    "function": st.fixed_dictionaries(
                        {}, optional={"name": st.text(max_size=3), "arguments": st.text(max_size=4)}
                    ),
                },
            ),
            max_size=2,
        ),
    },
)
chat_events = st.one_of(
    st.builds(lambda d, f: chunk(d, f), deltas, st.sampled_from([None, None, "stop", "length"])),
    st.just(DONE),
    st.just(b": keep-alive\n\n"),
    st.binary(max_size=20).map(lambda b: b"data: " + b + b"\n\n"),
)


@FAST
@given(st.lists(chat_events, max_size=12))
def test_any_chat_stream_gives_well_formed_events_ending_once(pieces: list[bytes]) -> None:
    stream = MessagesStream("claude", None, 1)
    out = events(b"".join(stream.feed(p) for p in pieces) + stream.finish())
    kinds = [e["type"] for e in out]
    assert stream.state is State.ENDED
    assert kinds[-1] in ("message_stop", "error")  # one end, whatever came
    assert kinds.count("message_stop") + kinds.count("error") == 1
    open_block = None
    for event in out:
        if event["type"] == "content_block_start":
            assert open_block is None
            open_block = event["index"]
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_block
            open_block = None
    assert open_block is None or kinds[-1] == "error"

"""Anthropic's answers on plain data: a Messages answer and stream (in any chunking) as chat
answers and chunks, and its errors in the taxonomy."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.providers.anthropic_wire import AnthropicWire, usage_of
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.stream.state import StreamState


def wire(usage: bool = True, trim: bool = False) -> AnthropicWire:
    return AnthropicWire("/v1/messages", b"", "claude-x", 1700000000, usage, trim)


def test_a_whole_answer_becomes_a_chat_completion() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "model": "claude-real",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "hello"},
            {"type": "tool_use", "id": "tu", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 3},
    }
    data, payload = wire().answer(orjson.dumps(message))
    assert orjson.loads(data) == payload
    choice = payload["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and payload["model"] == "claude-real"
    assert (
        choice["message"]["content"] == "hello" and choice["message"]["reasoning_content"] == "hmm"
    )
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert payload["usage"] == {
        "prompt_tokens": 8,
        "completion_tokens": 7,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    refused = {**message, "content": [], "stop_reason": "refusal"}
    assert (
        wire().answer(orjson.dumps(refused))[1]["choices"][0]["finish_reason"] == "content_filter"
    )
    with pytest.raises(ValueError):
        wire().answer(b'{"type": "error"}')


def _event(kind: str, **data: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


STREAM = b"".join(
    [
        _event(
            "message_start",
            message={"id": "msg_1", "model": "claude-real", "usage": {"input_tokens": 4}},
        ),
        _event("ping"),
        _event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
        _event(
            "content_block_delta",
            index=0,
            delta={"type": "thinking_delta", "thinking": "let me see"},
        ),
        _event("content_block_stop", index=0),
        _event("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        _event("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hel"}),
        _event("content_block_delta", index=1, delta={"type": "text_delta", "text": "lo \u00e9"}),
        _event("content_block_stop", index=1),
        _event(
            "content_block_start",
            index=2,
            content_block={"type": "tool_use", "id": "tu_1", "name": "f", "input": {}},
        ),
        _event(
            "content_block_delta",
            index=2,
            delta={"type": "input_json_delta", "partial_json": '{"a":'},
        ),
        _event(
            "content_block_delta",
            index=2,
            delta={"type": "input_json_delta", "partial_json": " 1}"},
        ),
        _event("content_block_stop", index=2),
        _event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 9}),
        _event("message_stop"),
    ]
)


def _replay(events: list[bytes]) -> StreamState:
    state = StreamState()
    for event in events:
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            state.observe(orjson.loads(event[6:]))
        elif event == b"data: [DONE]":
            state.done = True
    return state


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_the_event_machine_gives_the_same_chunks_in_any_chunking(size: int) -> None:
    decoder = wire().decoder()
    events: list[bytes] = []
    for start in range(0, len(STREAM), size):
        events.extend(decoder.feed(STREAM[start : start + size]))
    events.extend(decoder.finish())
    whole = wire().decoder()
    assert events == [*whole.feed(STREAM), *whole.finish()]
    state = _replay(events)
    assert state.content == "Hello \u00e9" and state.reasoning_text == "let me see"
    assert state.tools[0].id == "tu_1" and state.tools[0].name == "f"
    assert state.tools[0].args == '{"a": 1}'
    assert state.finished and state.done
    assert state.usage == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    first = orjson.loads(events[0][6:])
    assert first["model"] == "claude-real" and first["choices"][0]["delta"]["role"] == "assistant"
    assert b": ping" in events  # keeps the inter-chunk clock going, never relayed


def test_usage_is_sent_only_when_asked() -> None:
    events = wire(usage=False).decoder().feed(STREAM)
    assert not any(b'"usage"' in e for e in events)


def test_a_continued_answer_drops_the_space_the_prefill_left_out() -> None:
    decoder = wire(trim=True).decoder()
    events = decoder.feed(
        _event("message_start", message={"id": "m", "usage": {}})
        + _event("content_block_delta", index=0, delta={"type": "text_delta", "text": " "})
        + _event("content_block_delta", index=0, delta={"type": "text_delta", "text": " tok2 "})
        + _event("content_block_delta", index=0, delta={"type": "text_delta", "text": " tok3"})
    )
    assert _replay(events).content == "tok2  tok3"


@pytest.mark.parametrize(
    ("error_type", "kind"),
    [
        ("overloaded_error", failures.OVERLOADED),
        ("rate_limit_error", failures.RATE_LIMITED),
        ("api_error", failures.SERVER_ERROR),
    ],
)
def test_an_error_event_mid_stream_is_a_failure(error_type: str, kind: failures.Kind) -> None:
    decoder = wire().decoder()
    decoder.feed(STREAM[: STREAM.index(b"event: content_block_stop")])
    with pytest.raises(Failure) as info:
        decoder.feed(_event("error", error={"type": error_type, "message": "busy"}))
    assert info.value.kind is kind
    assert orjson.loads(info.value.body or b"")["error"]["message"] == "busy"


def test_a_malformed_event_stays_a_data_event_that_does_not_parse() -> None:
    """So the stream below counts it as malformed and relays nothing of it."""
    (event,) = wire().decoder().feed(b"event: content_block_delta\ndata: {not json\n\n")
    assert event.startswith(b"data: ")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(event[6:])


@pytest.mark.parametrize(
    ("status", "error_type", "message", "kind"),
    [
        (529, "overloaded_error", "Overloaded", failures.OVERLOADED),
        (429, "rate_limit_error", "slow down", failures.RATE_LIMITED),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 300000 tokens > 200000 maximum",
            failures.CONTEXT_LENGTH,
        ),
        (413, "request_too_large", "too large", failures.CONTEXT_LENGTH),
        (400, "invalid_request_error", "max_tokens: field required", failures.CLIENT_ERROR),
        (401, "authentication_error", "invalid x-api-key", failures.UPSTREAM_AUTH),
        (500, "api_error", "oops", failures.SERVER_ERROR),
    ],
)
def test_errors_are_classified(
    status: int, error_type: str, message: str, kind: failures.Kind
) -> None:
    body = orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    failure = wire().failure(status, body, (), 2.0, "d")
    assert failure.kind is kind and failure.retry_after == 2.0 and failure.status == status
    error = orjson.loads(failure.body or b"")["error"]
    assert error["message"] == message and error["code"] == kind.code


def test_the_text_before_an_error_event_is_given_before_the_error() -> None:
    decoder = wire().decoder()
    head = STREAM[: STREAM.index(b"event: content_block_stop")]
    events = decoder.feed(head + _event("error", error={"type": "overloaded_error"}))
    assert _replay(events).reasoning_text == "let me see"
    with pytest.raises(Failure) as info:
        decoder.finish()
    assert info.value.kind is failures.OVERLOADED


def test_cache_writes_and_thinking_are_kept_apart_in_the_translated_usage() -> None:
    usage = {
        "input_tokens": 5,
        "output_tokens": 9,
        "output_tokens_details": {"thinking_tokens": 7},
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 10,
        "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 6},
    }
    # OpenAI's `cache_write_tokens` counts every write; of those, the hour-long apart.
    assert usage_of(usage) == {
        "prompt_tokens": 18,
        "completion_tokens": 9,
        "total_tokens": 27,
        "prompt_tokens_details": {
            "cached_tokens": 3,
            "cache_write_tokens": 10,
            "cache_write_1h_tokens": 6,
        },
        "completion_tokens_details": {"reasoning_tokens": 7},
    }


REDACTED_START = {"type": "redacted_thinking", "data": "ZW5j"}
SIGNED = b"".join(
    [
        _event("message_start", message={"id": "msg_2", "usage": {"input_tokens": 4}}),
        _event("content_block_start", index=0, content_block=REDACTED_START),
        _event("content_block_stop", index=0),
        _event("content_block_start", index=1, content_block={"type": "thinking", "thinking": ""}),
        _event("content_block_delta", index=1, delta={"type": "thinking_delta", "thinking": "hm"}),
        _event(
            "content_block_delta", index=1, delta={"type": "signature_delta", "signature": "c2ln"}
        ),
        _event("content_block_stop", index=1),
        _event("content_block_start", index=2, content_block={"type": "text", "text": ""}),
        _event("content_block_delta", index=2, delta={"type": "text_delta", "text": "ok"}),
        _event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
        _event("message_stop"),
    ]
)


def test_signed_and_redacted_thinking_come_as_thinking_blocks_whole_and_streamed() -> None:
    redacted = {"type": "redacted_thinking", "data": "ZW5j"}
    signed = {"type": "thinking", "thinking": "hm", "signature": "c2ln"}
    message = {"type": "message", "content": [redacted, signed, {"type": "text", "text": "ok"}]}
    reply = wire().answer(orjson.dumps(message))[1]["choices"][0]["message"]
    assert reply["thinking_blocks"] == [redacted, signed] and reply["reasoning_content"] == "hm"
    deltas = [
        orjson.loads(e[6:])["choices"][0]["delta"]
        for e in wire(usage=False).decoder().feed(SIGNED)
        if e.startswith(b"data: {")
    ]
    assert deltas[1:4] == [
        {"thinking_blocks": [redacted]},
        {"reasoning_content": "hm"},
        {"thinking_blocks": [{"type": "thinking", "thinking": "", "signature": "c2ln"}]},
    ]
    state = StreamState()
    state.observe({"choices": [{"index": 0, "delta": deltas[3]}]})
    assert state.output and state.untracked  # no regenerated answer repeats a signature

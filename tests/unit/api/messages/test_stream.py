"""The stream state machine from chat chunks to Anthropic's events: by example, then fuzzed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.api.messages.stream import MessagesStream, State
from ballast.pipeline.errors import ApiError
from ballast.stream.event import events_of


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
    out = b"".join(stream.feed(events_of(p)) for p in pieces) + stream.finish()
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


def test_signed_and_redacted_thinking_come_back_with_their_signature_and_data() -> None:
    redacted = {"type": "redacted_thinking", "data": "ZW5j"}
    signature = {"type": "thinking", "thinking": "", "signature": "c2ln"}
    _, out = run(
        chunk({"thinking_blocks": [redacted]}),
        chunk({"reasoning_content": "hm"}),
        chunk({"thinking_blocks": [signature]}),
        chunk({"thinking_blocks": [signature]}),  # a block whose text never came: empty
        chunk({"content": "yes"}),
        chunk({}, "stop") + DONE,
    )
    kinds = [(e["type"], e.get("index")) for e in out if e["type"].startswith("content_block")]
    assert kinds == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
    ]
    starts = [e["content_block"] for e in out if e["type"] == "content_block_start"]
    assert starts[0] == redacted
    assert starts[1] == starts[2] == {"type": "thinking", "thinking": "", "signature": ""}
    deltas = [e["delta"] for e in out if e["type"] == "content_block_delta"]
    assert deltas[:3] == [
        {"type": "thinking_delta", "thinking": "hm"},
        {"type": "signature_delta", "signature": "c2ln"},
        {"type": "signature_delta", "signature": "c2ln"},
    ]


def test_the_relays_error_ends_the_stream_with_an_anthropic_error() -> None:
    stream = MessagesStream("claude", None, 42)
    said = stream.feed(events_of(chunk({"content": "a"})))
    error = ApiError(504, "stalled", "timeout", "upstream_stalled")
    out = events(said + stream.fail(error) + stream.finish())
    assert out[-1] == {"type": "error", "error": {"type": "timeout_error", "message": "stalled"}}
    assert "message_stop" not in [e["type"] for e in out]
    assert stream.feed(events_of(chunk({"content": "late"}))) == b""  # nothing after the end


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


FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


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
    out = events(b"".join(stream.feed(events_of(p)) for p in pieces) + stream.finish())
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

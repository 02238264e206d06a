"""What a stream has said so far, read from its events' parsed data."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.stream.state import StreamState


def test_a_stream_keeps_its_text_for_continuation_up_to_a_limit() -> None:
    state = StreamState(limit=10)
    for piece in ("abcd", "efgh"):
        state.observe({"choices": [{"delta": {"content": piece}}]})
    assert state.content == "abcdefgh" and not state.untracked
    state.observe({"choices": [{"delta": {"reasoning_content": "ijk"}}]})
    assert state.untracked  # past the limit: relayed on, never continued
    assert state.content == "" and state.reasoning_text == ""
    state.observe({"choices": [{"delta": {"content": "more"}, "finish_reason": "stop"}]})
    assert state.output and state.finished and state.content == ""


def test_the_output_tokens_relayed_count_text_reasoning_and_tool_arguments() -> None:
    state = StreamState(limit=10)  # past the limit the text goes, the count stays
    state.observe({"choices": [{"delta": {"content": "a" * 40}}]})  # 10 tokens of 4
    state.observe({"choices": [{"delta": {"reasoning_content": "b" * 8}}]})  # 2
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "c" * 8}}
    state.observe({"choices": [{"delta": {"tool_calls": [call]}}]})  # 2
    assert state.relayed_tokens == 14
    cjk = StreamState()
    for piece in "一二三四五六":  # a character a token, a delta each
        cjk.observe({"choices": [{"delta": {"content": piece}}]})
    assert cjk.relayed_tokens == 6


def test_the_output_tokens_of_a_responses_stream_count_every_kind_of_delta() -> None:
    state = StreamState()
    state.observe({"type": "response.output_text.delta", "delta": "a" * 8})
    state.observe({"type": "response.function_call_arguments.delta", "delta": "b" * 8})
    state.observe({"type": "response.reasoning_summary_text.delta", "delta": "c" * 8})
    assert state.relayed_tokens == 6


def test_a_messages_stream_is_read_as_anthropic_sends_it() -> None:
    state = StreamState()
    usage = {"input_tokens": 5, "cache_read_input_tokens": 40, "output_tokens": 1}
    state.observe({"type": "message_start", "message": {"usage": usage}})
    state.observe({"type": "ping"})
    block = {"type": "text", "text": ""}
    state.observe({"type": "content_block_start", "index": 0, "content_block": block})
    assert not state.output  # no output until a delta: the first-token clock still runs
    delta = {"type": "text_delta", "text": "hi"}
    state.observe({"type": "content_block_delta", "index": 0, "delta": delta})
    assert state.output and state.untracked  # relayed on, never continued
    ended = {"stop_reason": "end_turn"}
    state.observe({"type": "message_delta", "delta": ended, "usage": {"output_tokens": 7}})
    assert state.finished and not state.done and state.finish_reason == "end_turn"
    # The delta's counts replace message_start's; the cache figures stay.
    assert state.usage == {"input_tokens": 5, "cache_read_input_tokens": 40, "output_tokens": 7}
    state.observe({"type": "message_stop"})
    assert state.done


def test_a_messages_block_that_comes_whole_is_output() -> None:
    state = StreamState()
    block = {"type": "redacted_thinking", "data": "opaque"}
    state.observe({"type": "content_block_start", "index": 0, "content_block": block})
    assert state.output


def test_a_messages_streams_deltas_count_as_relayed_output() -> None:
    state = StreamState()
    usage = {"input_tokens": 5, "output_tokens": 1}
    state.observe({"type": "message_start", "message": {"usage": usage}})
    for delta in (
        {"type": "thinking_delta", "thinking": "t" * 8},
        {"type": "text_delta", "text": "a" * 8},
        {"type": "input_json_delta", "partial_json": '{"q": 1}'},
        {"type": "signature_delta", "signature": "s" * 400},  # not output: not counted
    ):
        state.observe({"type": "content_block_delta", "index": 0, "delta": delta})
    assert state.relayed_tokens == 6 and not state.finished


def _delta_bytes(kind: str, piece: str, index: int, space: str) -> bytes:
    field = "text" if kind == "text_delta" else "thinking"
    delta = {"type": "content_block_delta", "index": index, "delta": {"type": kind, field: piece}}
    return space.encode() + orjson.dumps(delta)


@settings(max_examples=300)
@given(
    st.sampled_from(["text_delta", "thinking_delta"]),
    st.text(max_size=30),
    st.integers(min_value=0, max_value=10_000),
    st.sampled_from(["", " "]),
)
def test_a_messages_delta_read_off_its_bytes_says_what_its_parse_says(
    kind: str, piece: str, index: int, space: str
) -> None:
    data = _delta_bytes(kind, piece, index, space)
    read_off, parsed = StreamState(), StreamState()
    parsed.observe(orjson.loads(data))
    if read_off.observe_plain_delta(data):
        assert piece.isascii() and piece.isprintable() and '"' not in piece
    else:
        read_off.observe(orjson.loads(data))  # escapes, other characters: parsed instead
    for state in (read_off, parsed):
        assert state.output and state.untracked
    assert (read_off.kept, read_off.pieces) == (parsed.kept, parsed.pieces) == (len(piece), 1)


def test_only_a_delta_in_anthropics_layout_is_read_off_its_bytes() -> None:
    state = StreamState()
    for data in (
        b'{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta",'
        b'"partial_json":"{}"}}',  # a tool's input: parsed
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\\nb"}}',
        b'{"index":0,"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}} ',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"',
    ):
        assert not state.observe_plain_delta(data)
    assert (state.kept, state.pieces, state.output) == (0, 0, False)

"""What a stream has said so far, read from its events' parsed data."""

from __future__ import annotations

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

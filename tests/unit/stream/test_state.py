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

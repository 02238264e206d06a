"""Replay and assembly: a kept answer replays as a stream and a stream assembles back into the
answer; only complete, successful answers are kept."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.cache.replay import is_complete, pieces, replay
from ballast.stream.assemble import assemble
from ballast.stream.event import StreamEvent, events_of, raw, read

CHAT = "/chat/completions"


def chat_body(content: str, **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 123,
        "model": "sim-chat",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None, **message},
                "logprobs": None,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def relayed(events: list[StreamEvent]) -> list[StreamEvent]:
    """The events as a client reads them back from the bytes."""
    return events_of(raw(events))


def chunks(stream: list[StreamEvent]) -> list[Any]:
    events = relayed(stream)
    assert events[-1].raw == b"data: [DONE]\n\n"
    return [orjson.loads(e.raw[5:]) for e in events[:-1]]


def test_replay_is_role_content_finish_usage_done() -> None:
    text = "tok0 tok1 tok2 " * 20
    body = orjson.dumps(chat_body(text))
    plain = chunks(replay(CHAT, body, include_usage=False))
    assert plain[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1" for c in plain)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in plain) == text
    assert len(plain) > 3  # several content chunks, not one blob
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in plain)
    asked = chunks(replay(CHAT, body, include_usage=True))
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["total_tokens"] == 8


def test_assembling_a_replay_gives_back_the_answer() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    for body in (chat_body("hello there " * 30), chat_body("", tool_calls=calls)):
        if body["choices"][0]["message"]["content"] == "":
            body["choices"][0]["message"]["content"] = None
        stream = replay(CHAT, orjson.dumps(body), include_usage=True)
        again = assemble(CHAT, relayed(stream))
        assert again is not None and orjson.loads(again) == body


def test_text_completions_replay_and_assemble() -> None:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "text": "a b c " * 30, "logprobs": None, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    stream = replay("/completions", orjson.dumps(body), include_usage=True)
    assert all(c["object"] == "text_completion" for c in chunks(stream))
    assert orjson.loads(assemble("/completions", relayed(stream)) or b"") == body


def test_an_unfinished_or_failed_stream_is_not_assembled() -> None:
    events = relayed(replay(CHAT, orjson.dumps(chat_body("some text")), False))
    assert assemble(CHAT, events) is not None
    assert assemble(CHAT, events[:-1]) is None  # no [DONE]
    assert assemble(CHAT, [e for e in events if b'finish_reason":"stop' not in e.raw]) is None
    error = read(b'data: {"error": {"message": "cut", "type": "api_error", "code": "stream_cut"}}')
    assert assemble(CHAT, [*events[:2], error]) is None
    assert assemble(CHAT, [*events[:2], read(b"data: {broken"), *events[2:]]) is None


def test_only_complete_successful_answers_are_kept() -> None:
    assert is_complete(CHAT, chat_body("x"))
    unfinished = chat_body("x")
    unfinished["choices"][0]["finish_reason"] = None
    assert not is_complete(CHAT, unfinished)
    assert not is_complete(CHAT, {"error": {"message": "no"}})
    assert not is_complete(CHAT, {"choices": []})
    assert is_complete("/embeddings", {"data": [{"embedding": [0.1]}]})
    assert not is_complete("/embeddings", {"data": []})


def test_pieces_keep_every_character() -> None:
    text = "word " * 100 + "x" * 1000 + " end"
    parts = pieces(text)
    assert "".join(parts) == text and len(parts) > 5
    assert pieces("") == []

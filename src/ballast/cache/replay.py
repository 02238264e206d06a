"""A cached answer is one complete, non-streamed body (a streamed one is assembled by
`ballast.stream.assemble`), and a cached body goes back out as a proper SSE stream: a role
chunk, content chunks, a finish chunk, a usage chunk when the client asked for one, and
`[DONE]`, each a typed event made here (never parsed back)."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.stream.assemble import COMPLETE_REASONS, identity
from ballast.stream.event import DONE_EVENT, StreamEvent

# Replayed text is cut into pieces of about this many characters, at whitespace.
PIECE = 64


def is_complete(path: str, payload: Any) -> bool:
    """A successful answer worth keeping: every choice finished normally (or the vectors)."""
    if not isinstance(payload, dict) or "error" in payload:
        return False
    if path == "/embeddings":
        data = payload.get("data")
        return isinstance(data, list) and bool(data)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(isinstance(c, dict) and c.get("finish_reason") in COMPLETE_REASONS for c in choices)


def pieces(text: str, size: int = PIECE) -> list[str]:
    """`text` in pieces of at least `size` characters, each ending after whitespace."""
    out: list[str] = []
    start = 0
    n = len(text)
    while start < n:
        end = start + size
        if end >= n:
            out.append(text[start:])
            break
        while end < n and not text[end - 1].isspace():
            end += 1
            if end - start >= size * 4:  # no whitespace for a long way: cut anyway
                break
        out.append(text[start:end])
        start = end
    return out


_sse = StreamEvent.of


def replay(path: str, body: bytes, include_usage: bool) -> list[StreamEvent]:
    """The chat events a streaming client would have got for this complete answer."""
    payload = orjson.loads(body)
    chat = path == "/chat/completions"
    head = identity(payload, "chat.completion.chunk" if chat else "text_completion")
    out: list[StreamEvent] = []
    choices = payload.get("choices") or []
    for choice in choices:
        index = choice.get("index", 0)
        if chat:
            message = choice.get("message") or {}
            first: dict[str, Any] = {"role": message.get("role") or "assistant", "content": ""}
            if message.get("refusal") is not None:
                first["refusal"] = message["refusal"]
            out.append(_sse({**head, "choices": [_chat_choice(index, first)]}))
            for piece in pieces(message.get("content") or ""):
                out.append(_sse({**head, "choices": [_chat_choice(index, {"content": piece})]}))
            tool_calls = message.get("tool_calls")
            if tool_calls:
                calls = [{"index": i, **call} for i, call in enumerate(tool_calls)]
                out.append(_sse({**head, "choices": [_chat_choice(index, {"tool_calls": calls})]}))
            finish = _chat_choice(index, {})
        else:
            for piece in pieces(choice.get("text") or ""):
                out.append(_sse({**head, "choices": [_text_choice(index, piece)]}))
            finish = _text_choice(index, "")
        finish["finish_reason"] = choice.get("finish_reason")
        out.append(_sse({**head, "choices": [finish]}))
    if include_usage and payload.get("usage") is not None:
        out.append(_sse({**head, "choices": [], "usage": payload["usage"]}))
    out.append(DONE_EVENT)
    return out


def _chat_choice(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def _text_choice(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}

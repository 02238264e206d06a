"""A cached answer is one complete, non-streamed body. A streamed answer becomes one when it
completes (assembled from the events the client got, so an answer healed by continuation is
stored whole), and a cached body goes back out as a proper SSE stream: a role chunk, content
chunks, a finish chunk, a usage chunk when the client asked for one, and `[DONE]`."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.upstream.sse import REASONING_FIELDS, event_data

DONE = b"data: [DONE]\n\n"
# Replayed text is cut into pieces of about this many characters, at whitespace.
PIECE = 64
_COMPLETE_REASONS = frozenset({"stop", "length", "tool_calls", "function_call"})


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
    return all(isinstance(c, dict) and c.get("finish_reason") in _COMPLETE_REASONS for c in choices)


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


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def replay(path: str, body: bytes, include_usage: bool) -> bytes:
    """The SSE stream a streaming client would have got for this complete answer."""
    payload = orjson.loads(body)
    chat = path == "/chat/completions"
    head: dict[str, Any] = {
        "id": payload.get("id", ""),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": payload.get("created", 0),
        "model": payload.get("model", ""),
    }
    if payload.get("system_fingerprint") is not None:
        head["system_fingerprint"] = payload["system_fingerprint"]
    out: list[bytes] = []
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
    out.append(DONE)
    return b"".join(out)


def _chat_choice(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def _text_choice(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}


class _Choice:
    __slots__ = ("content", "finish", "reasoning", "refusal", "role", "tools")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: dict[str, list[str]] = {}  # by the field it came in
        self.refusal: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None


def assemble(path: str, events: list[bytes], usage: Any = None) -> bytes | None:
    """The complete body for a stream the client received whole, or None when it was not
    (an error event, a choice that never finished, no `[DONE]`, or anything not understood:
    such an answer is simply not cached)."""
    if path == "/responses":
        return _final_response(events)
    chat = path == "/chat/completions"
    head: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    done = False
    for event in events:
        data = event_data(event)
        if data is None:
            continue
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        if head is None:
            head = chunk
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            if not isinstance(raw, dict) or raw.get("logprobs") is not None:
                return None
            index = raw.get("index", 0)
            if not isinstance(index, int):
                return None
            choice = choices.setdefault(index, _Choice())
            if raw.get("finish_reason"):
                choice.finish = raw["finish_reason"]
            if not chat:
                text = raw.get("text")
                if isinstance(text, str):
                    choice.content.append(text)
                continue
            delta = raw.get("delta")
            if not isinstance(delta, dict):
                continue
            if not _merge_delta(choice, delta):
                return None
    if not done or head is None or not choices:
        return None
    if any(c.finish not in _COMPLETE_REASONS for c in choices.values()):
        return None
    body: dict[str, Any] = {
        "id": head.get("id", ""),
        "object": "chat.completion" if chat else "text_completion",
        "created": head.get("created", 0),
        "model": head.get("model", ""),
    }
    if head.get("system_fingerprint") is not None:
        body["system_fingerprint"] = head["system_fingerprint"]
    body["choices"] = [
        _chat_message(i, choices[i]) if chat else _text_message(i, choices[i])
        for i in sorted(choices)
    ]
    if isinstance(usage, dict):
        body["usage"] = usage
    return orjson.dumps(body)


def _final_response(events: list[bytes]) -> bytes | None:
    """A Responses stream's whole answer: the Response its last event carries (OpenAI sends
    the complete object with `response.completed`), or None when it did not complete."""
    for event in reversed(events):
        data = event_data(event)
        if data is None:
            continue
        try:
            final = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        kind = final.get("type") if isinstance(final, dict) else None
        response = final.get("response") if isinstance(final, dict) else None
        if kind in ("response.completed", "response.incomplete") and isinstance(response, dict):
            return orjson.dumps(response)
        return None
    return None


def _merge_delta(choice: _Choice, delta: dict[str, Any]) -> bool:
    for name, value in delta.items():
        if value is None:
            continue
        if name == "role" and isinstance(value, str):
            choice.role = value
        elif name == "content" and isinstance(value, str):
            choice.content.append(value)
        elif name == "refusal" and isinstance(value, str):
            choice.refusal.append(value)
        elif name in REASONING_FIELDS and isinstance(value, str):
            choice.reasoning.setdefault(name, []).append(value)
        elif name == "tool_calls" and isinstance(value, list):
            for call in value:
                if not isinstance(call, dict) or not isinstance(call.get("index"), int):
                    return False
                _merge_call(choice.tools.setdefault(call["index"], {}), call)
        else:
            return False  # something this cache does not know how to put back together
    return True


def _merge_call(into: dict[str, Any], call: dict[str, Any]) -> None:
    for name in ("id", "type"):
        if call.get(name):
            into[name] = call[name]
    function = call.get("function")
    if isinstance(function, dict):
        target = into.setdefault("function", {"name": "", "arguments": ""})
        if isinstance(function.get("name"), str):
            target["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            target["arguments"] += function["arguments"]


def _chat_message(index: int, choice: _Choice) -> dict[str, Any]:
    text = "".join(choice.content)
    message: dict[str, Any] = {
        "role": choice.role,
        "content": text if text or not choice.tools else None,
        "refusal": "".join(choice.refusal) if choice.refusal else None,
    }
    for name, pieces in choice.reasoning.items():
        message[name] = "".join(pieces)
    if choice.tools:
        message["tool_calls"] = [
            {"type": "function", **choice.tools[i]} for i in sorted(choice.tools)
        ]
    return {"index": index, "message": message, "logprobs": None, "finish_reason": choice.finish}


def _text_message(index: int, choice: _Choice) -> dict[str, Any]:
    return {
        "index": index,
        "text": "".join(choice.content),
        "logprobs": None,
        "finish_reason": choice.finish,
    }


def split_events(data: bytes) -> list[bytes]:
    """Whole SSE events (as relayed: each ends with a blank line) without their terminator."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    return [e for e in data.split(b"\n\n") if e.strip()]

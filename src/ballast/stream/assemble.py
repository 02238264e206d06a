"""A whole answer put back together from its stream: the events a client received whole (so
an answer healed by continuation is assembled whole too), for the response cache and for a
whole answer asked of an upstream as a stream. Reads the typed events' parsed data."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.stream.event import NOT_JSON, StreamEvent
from ballast.stream.state import REASONING_FIELDS

COMPLETE_REASONS = frozenset({"stop", "length", "tool_calls", "function_call"})


class _Choice:
    __slots__ = ("content", "finish", "reasoning", "refusal", "role", "thought", "tools")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: dict[str, list[str]] = {}  # by the field it came in
        self.refusal: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        # Signed thinking blocks (`thinking_blocks` deltas): a block's text is the reasoning
        # since the block before it closed, the delta brings its signature.
        self.thought: _Thought | None = None


class _Thought:
    __slots__ = ("blocks", "said")

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.said = 0  # reasoning characters already in a block


def _merge_thoughts(choice: _Choice, given: list[Any]) -> bool:
    thought = choice.thought
    if thought is None:
        thought = choice.thought = _Thought()
    for block in given:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            signature, text = block.get("signature"), block.get("thinking") or ""
            if not isinstance(signature, str) or not isinstance(text, str):
                return False
            reasoning = "".join(next(iter(choice.reasoning.values()), []))
            text = reasoning[thought.said :] + text
            thought.said = len(reasoning)
            thought.blocks.append({"type": kind, "thinking": text, "signature": signature})
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            thought.blocks.append({"type": kind, "data": block["data"]})
        else:
            return False
    return True


def assemble(path: str, events: list[StreamEvent], usage: Any = None) -> bytes | None:
    """The complete body for a stream the client received whole, or None when it was not
    (an error event, a choice that never finished, no `[DONE]`, or anything not understood:
    such an answer is simply not cached)."""
    answer = assemble_payload(path, events, usage)
    return None if answer is None else orjson.dumps(answer)


def assemble_payload(
    path: str, events: list[StreamEvent], usage: Any = None
) -> dict[str, Any] | None:
    """`assemble`'s answer as the object it encodes (for a caller that reads it, so it is
    not parsed back from its bytes)."""
    if path == "/responses":
        return _final_response(events)
    chat = path == "/chat/completions"
    head: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    done = False
    for event in events:
        if event.data is None:
            continue
        chunk = event.json
        if chunk is NOT_JSON:
            if not event.done:
                return None
            done = True
            continue
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        if head is None:
            head = chunk
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            if not _merge_choice(choices, raw, chat):
                return None
    if not done or head is None or not choices:
        return None
    if any(c.finish not in COMPLETE_REASONS for c in choices.values()):
        return None
    body = identity(head, "chat.completion" if chat else "text_completion")
    body["choices"] = [
        _chat_message(i, choices[i]) if chat else _text_message(i, choices[i])
        for i in sorted(choices)
    ]
    if isinstance(usage, dict):
        body["usage"] = usage
    return body


def identity(source: dict[str, Any], kind: str) -> dict[str, Any]:
    """The fields a chunk and its whole answer share (id, created, model, fingerprint),
    taken from `source` for an object of `kind`: a stream's first chunk made whole, or a whole
    answer replayed as chunks."""
    out: dict[str, Any] = {
        "id": source.get("id", ""),
        "object": kind,
        "created": source.get("created", 0),
        "model": source.get("model", ""),
    }
    if source.get("system_fingerprint") is not None:
        out["system_fingerprint"] = source["system_fingerprint"]
    return out


def _merge_choice(choices: dict[int, _Choice], raw: Any, chat: bool) -> bool:
    """One chunk's choice added to what its index said before; False for one not understood."""
    if not isinstance(raw, dict) or raw.get("logprobs") is not None:
        return False
    index = raw.get("index", 0)
    if not isinstance(index, int):
        return False
    choice = choices.setdefault(index, _Choice())
    if raw.get("finish_reason"):
        choice.finish = raw["finish_reason"]
    if not chat:
        text = raw.get("text")
        if isinstance(text, str):
            choice.content.append(text)
        return True
    delta = raw.get("delta")
    return not isinstance(delta, dict) or _merge_delta(choice, delta)


def _final_response(events: list[StreamEvent]) -> dict[str, Any] | None:
    """A Responses stream's whole answer: the Response its last event carries (OpenAI sends
    the complete object with `response.completed`), or None when it did not complete."""
    for event in reversed(events):
        if event.data is None:
            continue
        final = event.json
        kind = final.get("type") if isinstance(final, dict) else None
        response = final.get("response") if isinstance(final, dict) else None
        if kind in ("response.completed", "response.incomplete") and isinstance(response, dict):
            return response
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
        elif name == "thinking_blocks" and isinstance(value, list):
            if not _merge_thoughts(choice, value):
                return False
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
    if choice.thought is not None:
        message["thinking_blocks"] = choice.thought.blocks
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

"""A chat answer as an Anthropic Message: content blocks, stop reason and usage. The stream
translator (stream.py) uses the same mappings, so both forms agree."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.stream.usage import read

# A chat finish_reason -> Anthropic's stop_reason ("stop" is refined by `stop_reason`).
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
REASONING_FIELDS = ("reasoning_content", "reasoning")


def message_id(chat_id: Any) -> str:
    """An Anthropic message id made from the upstream's answer id (an Anthropic
    deployment's own `msg_` id kept as it is)."""
    text = chat_id if isinstance(chat_id, str) and chat_id else "ballast"
    return text if text.startswith("msg_") else "msg_" + text.removeprefix("chatcmpl-")


def stop_reason(finish: Any, matched: Any, stops: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). A chat answer does not say whether a stop sequence
    ended it, except where the upstream names the one it matched (vLLM's `stop_reason`);
    otherwise a "stop" is a natural end of turn."""
    if finish == "stop" and isinstance(matched, str) and isinstance(stops, list):
        if matched in stops:
            return "stop_sequence", matched
    if not isinstance(finish, str):
        return "end_turn", None
    return _STOP_REASONS.get(finish, "end_turn"), None


def usage_of(usage: Any, estimate: int = 0) -> dict[str, Any]:
    """Anthropic usage from chat usage. Anthropic counts the tokens read from a prompt cache
    and those written to it apart from `input_tokens` (a chat upstream counts them inside
    `prompt_tokens`), splits the writes by how long they are kept, and names the thinking
    part of `output_tokens`."""
    if not isinstance(usage, dict):
        return {"input_tokens": estimate, "output_tokens": 0}
    prompt, completion, cached, written, long, reasoning = read(usage)
    out: dict[str, Any] = {"input_tokens": prompt - cached - written, "output_tokens": completion}
    if cached or written:
        out["cache_read_input_tokens"] = cached
        out["cache_creation_input_tokens"] = written
        out["cache_creation"] = {
            "ephemeral_5m_input_tokens": written - long,
            "ephemeral_1h_input_tokens": long,
        }
    if reasoning:
        out["output_tokens_details"] = {"thinking_tokens": reasoning}
    return out


def thinking_blocks(given: Any) -> list[dict[str, Any]]:
    """The signed thinking blocks a chat answer carries (anthropic_wire.py's
    `thinking_blocks`), as Anthropic gave them; none it cannot read."""
    out: list[dict[str, Any]] = []
    for block in given if isinstance(given, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            if isinstance(text, str) and isinstance(signature, str):
                out.append({"type": kind, "thinking": text, "signature": signature})
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            out.append({"type": kind, "data": block["data"]})
    return out


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic's `input` is. Arguments that are not
    a JSON object (a model's broken output) are kept whole under `_arguments`, not lost."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"_arguments": arguments}


def message_body(chat: dict[str, Any], model: str, stops: Any, estimate: int = 0) -> dict[str, Any]:
    """The Message for a whole chat answer."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    if not isinstance(choice, dict):
        choice = {}
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    content = thinking_blocks(message.get("thinking_blocks"))
    for name in REASONING_FIELDS if not content else ():
        reasoning = message.get(name)
        if isinstance(reasoning, str) and reasoning:  # unsigned: no Anthropic model made it
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
            break
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else ()):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = call.get("id")
        content.append(
            {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{i}",
                "name": str(function.get("name") or ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stops)
    answered = chat.get("model")
    return {
        "id": message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": answered if isinstance(answered, str) and answered else model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(chat.get("usage"), estimate),
    }

"""A chat completion as a Response object (the bridge's whole answer), and the parts the
stream translator builds the same way: one shape for an item, whether streamed or not."""

from __future__ import annotations

import os
from itertools import count
from typing import Any

from ballast.stream.usage import read

_PREFIX = os.urandom(6).hex()
_serial = count(1)


def new_id(kind: str) -> str:
    """`resp_...`, `msg_...`, `fc_...`, `rs_...`: unique per process and start."""
    return f"{kind}_{_PREFIX}{next(_serial):08x}"


def shell(request: dict[str, Any], response_id: str, created: int, model: str) -> dict[str, Any]:
    """A Response with no output yet, echoing what the request asked for."""
    text = request.get("text")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
    }


def usage_of(chat_usage: Any) -> dict[str, Any] | None:
    """A Response's usage from chat usage: the tokens read from the prompt cache and written
    to it (`cache_write_1h_tokens`: of those, kept for an hour, where the provider says) are
    parts of `input_tokens`, the reasoning tokens of `output_tokens`."""
    if not isinstance(chat_usage, dict):
        return None
    prompt, completion, cached, written, long, reasoning = read(chat_usage)
    details = {"cached_tokens": cached, "cache_write_tokens": written}
    if long:
        details["cache_write_1h_tokens"] = long
    return {
        "input_tokens": prompt,
        "input_tokens_details": details,
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [text_part(text)] if status != "in_progress" else [],
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def finish(response: dict[str, Any], finish_reason: Any, usage: Any) -> None:
    """Set the final status: `length` (or a content filter) makes the response incomplete."""
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "content_filter"}
    else:
        response["status"] = "completed"
    response["usage"] = usage_of(usage)


def to_response(
    chat: dict[str, Any], request: dict[str, Any], response_id: str, created: int
) -> dict[str, Any]:
    """The Response for a whole chat completion."""
    model = chat.get("model")
    response = shell(request, response_id, created, model if isinstance(model, str) else "")
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    output = response["output"]
    thinking = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thinking, str) and thinking:
        output.append(reasoning_item(new_id("rs"), thinking))
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(message_item(new_id("msg"), content, status))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        item = message_item(new_id("msg"), "", status)
        item["content"] = [{"type": "refusal", "refusal": refusal}]
        output.append(item)
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            output.append(
                call_item(
                    new_id("fc"),
                    str(call.get("id") or new_id("call")),
                    str(function.get("name") or ""),
                    str(function.get("arguments") or ""),
                )
            )
    finish(response, choice.get("finish_reason"), chat.get("usage"))
    return response

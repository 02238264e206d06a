"""An OpenAI chat request as an Anthropic Messages request: plain dicts in, plain dicts out.

System and developer messages become `system`; image parts become image blocks; tool calls
and tool results become `tool_use` and `tool_result` blocks; consecutive messages of one
role are merged (Messages wants the roles to alternate). `thinking` and every block's
`cache_control` pass through as they came (a tool call's and a tool message's own
`cache_control` go on its `tool_use` and `tool_result` block). An assistant message's
`thinking_blocks` (its earlier thinking as the answers' translation gives it back:
`{"type": "thinking", "thinking", "signature"}` or `{"type": "redacted_thinking", "data"}`)
open its turn again, exactly and in order, ahead of its text and tool calls: Anthropic
refuses a tool turn with thinking on without them."""

from __future__ import annotations

from typing import Any

import orjson

_STOP_KEYS = ("temperature", "top_p", "top_k", "thinking", "metadata", "service_tier")


class Untranslatable(ValueError):
    """A request Messages cannot express; the message names what."""


def messages_request(payload: dict[str, Any], model: str, max_tokens: int) -> dict[str, Any]:
    """The Messages body for a chat request (with its edits and any assistant prefill the
    answer must go on from applied)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("messages must be a non-empty list")
    _check_unsupported(payload)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            raise Untranslatable("each message must be an object")
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_blocks(message.get("content"), role))
            continue
        if role == "user":
            _add(turns, "user", _blocks(message.get("content"), role))
        elif role == "assistant":
            _add(turns, "assistant", _assistant_blocks(message))
        elif role in ("tool", "function"):
            _add(turns, "user", [_tool_result(message)])
        else:
            raise Untranslatable(f"unknown message role {role!r}")
    out: dict[str, Any] = {"model": model, "messages": turns}
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    out["max_tokens"] = limit if isinstance(limit, int) and limit > 0 else max_tokens
    if system:
        out["system"] = _system(system)
    for key in _STOP_KEYS:
        if payload.get(key) is not None:
            out[key] = payload[key]
    stop = payload.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stop_sequences"] = stop
    user = payload.get("user")
    if isinstance(user, str) and "metadata" not in out:
        out["metadata"] = {"user_id": user}
    tools = payload.get("tools")
    if tools:
        out["tools"] = [_tool(tool) for tool in tools]
    choice = _tool_choice(payload.get("tool_choice"), payload.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    if payload.get("stream"):
        out["stream"] = True
    return out


def _check_unsupported(payload: dict[str, Any]) -> None:
    """What Messages would silently not do: better another provider than a wrong answer."""
    if payload.get("n") not in (None, 1):
        raise Untranslatable("n > 1: Messages gives one answer per request")
    if payload.get("logprobs"):
        raise Untranslatable("logprobs: Messages has none")
    response_format = payload.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise Untranslatable("response_format: Messages has no JSON mode")


def _add(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def _system(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A plain string when it is only text, else the blocks (cache_control kept)."""
    if all(set(block) == {"type", "text"} for block in blocks):
        return "\n\n".join(block["text"] for block in blocks)
    return blocks


def _blocks(content: Any, role: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise Untranslatable(f"a {role} message's content must be a string or a list")
    return [_part(part) for part in content]


def _part(part: Any) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise Untranslatable("a content part must be an object")
    kind = part.get("type")
    if kind == "text":
        block: dict[str, Any] = {"type": "text", "text": part.get("text") or ""}
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise Untranslatable("an image_url part needs a url")
        block = {"type": "image", "source": _image_source(url)}
    elif kind in ("image", "document", "tool_use", "tool_result", "thinking"):
        return part  # already an Anthropic block: passed as it is
    else:
        raise Untranslatable(f"content parts of type {kind!r} are not supported here")
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _image_source(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";", 1)[0]
        if ";base64" not in head or not media_type:
            raise Untranslatable("an image data URL must be base64 with a media type")
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = _thinking_blocks(message.get("thinking_blocks"))
    blocks += _blocks(message.get("content"), "assistant")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise Untranslatable("tool_calls must be a list")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise Untranslatable("a tool call needs a function")
        arguments = function.get("arguments") or "{}"
        try:
            given = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        except orjson.JSONDecodeError:
            raise Untranslatable("a tool call's arguments must be JSON") from None
        use = {
            "type": "tool_use",
            "id": call.get("id") or "",
            "name": function.get("name") or "",
            "input": given if isinstance(given, dict) else {"value": given},
        }
        if "cache_control" in call:
            use["cache_control"] = call["cache_control"]
        blocks.append(use)
    return blocks


def _thinking_blocks(given: Any) -> list[dict[str, Any]]:
    """An assistant message's earlier thinking as the blocks Anthropic signed, field for
    field (a signature covers the text: nothing in them may change)."""
    if given is None:
        return []
    if not isinstance(given, list):
        raise Untranslatable("thinking_blocks must be a list")
    out: list[dict[str, Any]] = []
    for block in given:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            if not isinstance(text, str) or not isinstance(signature, str):
                raise Untranslatable("a thinking block needs its thinking and signature")
            out.append({"type": "thinking", "thinking": text, "signature": signature})
        elif kind == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str):
                raise Untranslatable("a redacted_thinking block needs its data")
            out.append({"type": "redacted_thinking", "data": data})
        else:
            raise Untranslatable("thinking_blocks holds thinking or redacted_thinking blocks")
    return out


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        content = [_part(part) for part in content]
    elif not isinstance(content, str):
        content = "" if content is None else orjson.dumps(content).decode()
    block = {
        "type": "tool_result",
        "tool_use_id": message.get("tool_call_id") or message.get("name") or "",
        "content": content,
    }
    if "cache_control" in message:
        block["cache_control"] = message["cache_control"]
    return block


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise Untranslatable("each tool must be an object")
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return tool  # an Anthropic tool (a server tool, or one already in its shape)
    out: dict[str, Any] = {
        "name": function.get("name") or "",
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        out["description"] = function["description"]
    if "cache_control" in tool:
        out["cache_control"] = tool["cache_control"]
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        out: dict[str, Any] | None = {"type": "auto"} if parallel is False else None
    elif choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    elif choice == "none":
        out = {"type": "none"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name") or ""}
    else:
        raise Untranslatable("tool_choice is not one Messages can express")
    if out is not None and parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out

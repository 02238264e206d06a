"""Pieces of the chat-completion wire that native adapters build answers from: one place for
the chunk and answer shapes, the client's message parts, and the OpenAI-shaped error body a
translated failure carries (a provider's own error body never reaches an OpenAI client)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from ballast.resilience.failures import CLIENT_ERROR, UNSUPPORTED, Failure, Kind, openai_error_body


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is an object, else an empty one: a provider's answer is read
    defensively, since a field of the wrong type must be an error, never a crash."""
    return value if isinstance(value, dict) else {}


def seq(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def count(value: Any) -> int:
    """A token count: a non-negative integer, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def chunk(
    ids: tuple[str, int, str], delta: dict[str, Any], finish_reason: str | None = None
) -> dict[str, Any]:
    """One `chat.completion.chunk`; `ids` is (id, created, model)."""
    ident, created, model = ids
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(ids: tuple[str, int, str], counts: dict[str, Any]) -> dict[str, Any]:
    """The closing chunk a stream with `include_usage` ends with: no choices, the usage."""
    ident, created, model = ids
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": counts,
    }


def answer(
    ids: tuple[str, int, str],
    text: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A whole `chat.completion` with one choice."""
    ident, created, model = ids
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def tool_call(ident: str, name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": text}}


def openai_error(kind: Kind, message: str) -> bytes:
    """A provider's error as the OpenAI body the chat shape passes on."""
    return openai_error_body(message, kind.error_type, kind.code)


def failure(
    kind: Kind,
    message: str,
    status: int | None = None,
    retry_after: float | None = None,
    deployment: str | None = None,
) -> Failure:
    """A translated failure whose body (for pass-through kinds) is already OpenAI's shape."""
    return Failure(
        kind,
        message,
        status=status if status is not None else kind.status,
        body=openai_error(kind, message),
        retry_after=retry_after,
        deployment=deployment,
    )


def unsupported(message: str) -> Failure:
    """The request is fine but this provider cannot express it: another deployment of the
    group may (the unsupported kind fails over without a verdict on this one)."""
    return failure(UNSUPPORTED, message)


def bad_request(message: str) -> Failure:
    """The client's request cannot be said in the provider's wire: its own error, no retry."""
    return failure(CLIENT_ERROR, message)


def parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as a list of OpenAI parts (`text`, `image_url`), each checked."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request("message content must be a string or an array of parts")
    out: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request("each content part must be an object with a type")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise bad_request("a text part needs its text")
        out.append(part)
    return out


def functions(payload: dict[str, Any], provider: str) -> list[dict[str, Any]]:
    """The request's function tools, each `function` checked: a name, an optional
    description and an optional parameters object."""
    tools = payload.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("tools must be an array")
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise unsupported(f"only function tools can be sent to {provider}")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("each function tool needs a function with a name")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_request("a function's parameters must be an object")
        if not isinstance(function.get("description", ""), str):
            raise bad_request("a function's description must be a string")
        out.append(function)
    return out


def text_of(content: Any) -> str:
    return "".join(str(p.get("text", "")) for p in parts(content) if p.get("type") == "text")


def data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a `data:` URL, or None for any other URL."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    media, _, encoding = head.partition(";")
    if not sep or encoding != "base64" or not media:
        raise bad_request("an image data URL must be data:<type>;base64,<data>")
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        raise bad_request("an image data URL holds invalid base64") from None
    return media, data


def image_url(part: dict[str, Any]) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise bad_request("an image_url part needs a url")
    return url


def arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as an object (the chat wire carries them as JSON text)."""
    function = call.get("function") or {}
    raw = function.get("arguments") or "{}"
    try:
        value = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        raise bad_request("tool call arguments must be JSON") from None
    if not isinstance(value, dict):
        raise bad_request("tool call arguments must be a JSON object")
    return value


def messages(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages, checked for the shape the translations read: objects with a
    role, and tool calls that are objects with a function object."""
    found = payload.get("messages")
    if not isinstance(found, list) or not found:
        raise bad_request("messages must be a non-empty array")
    for message in found:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("each message must be an object with a role")
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise bad_request("tool_calls must be an array")
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                raise bad_request("each tool call must be an object with a function")
            if not isinstance(call["function"].get("name"), str):
                raise bad_request("each tool call must name its function")
    return found


def tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_call_id -> function name, from the assistant messages (a tool result names only
    the id; Gemini's function responses need the name)."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                names[call["id"]] = str((call.get("function") or {}).get("name", ""))
    return names


def stops(payload: dict[str, Any]) -> list[str] | None:
    stop = payload.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise bad_request("stop must be a string or an array of strings")


def max_tokens(payload: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad_request(f"{key} must be a positive integer")
        return value
    return None

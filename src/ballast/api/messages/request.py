"""An Anthropic Messages request as the chat completion an upstream is sent.

Read field by field into a new chat payload (the pipeline's terms); anything unusable is a
400 naming the field the way Anthropic's API does (`messages.0.content.1.source.type`).
What a chat completion has no place for is left out and named in `dropped` (the client
learns it from the `x-ballast-dropped` header; docs/shapes.md lists them): `top_k`,
`thinking` (the budget) and earlier turns' thinking blocks (chat upstreams reject or ignore
reasoning in a request), `cache_control` marks, `service_tier`, `context_management`, MCP
servers, a container, server tools (`tools.<type>`: Anthropic runs them, a chat upstream
cannot), and any field this translation does not know."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.pipeline.context import param_name
from ballast.pipeline.errors import ApiError, bad_request

MAX_TOKENS_LIMIT = 1 << 24
# The top-level fields the translation reads; any other is dropped and named.
_READ = frozenset(
    (
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "metadata",
        "output_config",
        "cache",
        "fallbacks",
    )
)
# Tool types Anthropic runs on its own side (web search, code execution, computer use...):
# a chat upstream cannot run them. A custom tool has no type, or "custom".
_CLIENT_TOOL_TYPES = (None, "custom")


def invalid(field: str, message: str) -> ApiError:
    """A 400 naming the field, in the words Anthropic's API uses."""
    return bad_request(f"{field}: {message}", field)


def to_chat(
    payload: Any, counting: bool = False, dropped: list[str] | None = None
) -> dict[str, Any]:
    """The chat payload for an Anthropic request body (already parsed JSON). `counting`:
    a count_tokens body, which needs no `max_tokens`. What it leaves out is appended to
    `dropped`, each name once."""
    if dropped is None:
        dropped = []
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "Field required" if model is None else "Input should be a string")
    chat: dict[str, Any] = {"model": model}
    messages = _system(payload.get("system"), dropped)
    given = payload.get("messages")
    if not isinstance(given, list):
        raise invalid("messages", "Field required" if given is None else "Input should be a list")
    if not given and not counting:
        raise invalid("messages", "at least one message is required")
    for i, message in enumerate(given):
        messages.extend(_message(message, f"messages.{i}", dropped))
    chat["messages"] = messages
    if not counting:
        chat["max_tokens"] = _max_tokens(payload.get("max_tokens"))
    for name in sorted(payload.keys() - _READ):
        if payload[name] is not None:
            _drop(dropped, param_name(name))
    _sampling(payload, chat)
    tools = payload.get("tools")
    if tools is not None:
        chat["tools"] = _tools(tools, dropped)
        if not chat["tools"] and tools:
            del chat["tools"]
    choice = payload.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, chat)
    output = payload.get("output_config")
    if output is not None:
        _output_config(output, chat, dropped)
    metadata = payload.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise invalid("metadata", "Input should be an object")
        user = metadata.get("user_id")
        if user is not None:
            if not isinstance(user, str):
                raise invalid("metadata.user_id", "Input should be a string")
            chat["user"] = user
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "Input should be a valid boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # output tokens in message_delta
    for name in ("cache", "fallbacks"):  # Ballast's own fields, read by the pipeline
        if name in payload:
            chat[name] = payload[name]
    return chat


def _drop(dropped: list[str], name: str) -> None:
    if name not in dropped:
        dropped.append(name)


def _output_config(output: Any, chat: dict[str, Any], dropped: list[str]) -> None:
    """A JSON schema for the answer becomes the chat `response_format`; the effort level has
    no chat counterpart every upstream takes, and is left out."""
    if not isinstance(output, dict):
        raise invalid("output_config", "Input should be an object")
    if output.get("effort") is not None:
        _drop(dropped, "output_config.effort")
    given = output.get("format")
    if given is None:
        return
    if not isinstance(given, dict) or given.get("type") != "json_schema":
        raise invalid("output_config.format.type", "Input should be 'json_schema'")
    schema = given.get("schema")
    if not isinstance(schema, dict):
        raise invalid("output_config.format.schema", "Field required")
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


def _max_tokens(value: Any) -> int:
    if value is None:
        raise invalid("max_tokens", "Field required")
    if type(value) is not int or not 1 <= value <= MAX_TOKENS_LIMIT:
        raise invalid("max_tokens", f"Input should be an integer from 1 to {MAX_TOKENS_LIMIT}")
    return value


def _sampling(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if value is None:
            continue
        if type(value) not in (int, float) or not 0 <= value <= (2 if name == "temperature" else 1):
            raise invalid(name, "Input should be a number in the allowed range")
        chat[name] = value
    top_k = payload.get("top_k")
    if top_k is not None and (type(top_k) is not int or top_k < 0):
        raise invalid("top_k", "Input should be a non-negative integer")
    stops = payload.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise invalid("stop_sequences", "Input should be a list of strings")
        if stops:
            chat["stop"] = stops


def _system(system: Any, dropped: list[str]) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise invalid("system", "Input should be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"system.{i}.type", "Input should be 'text'")
        if "cache_control" in block:
            _drop(dropped, "cache_control")
        texts.append(_text(block, f"system.{i}"))
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _text(block: dict[str, Any], field: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(
            f"{field}.text", "Field required" if text is None else "Input should be a string"
        )
    return text


def _message(message: Any, field: str, dropped: list[str]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user turn's tool results become tool
    messages of their own, ahead of what else the turn says."""
    if not isinstance(message, dict):
        raise invalid(field, "Input should be an object")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise invalid(f"{field}.role", "Input should be 'user', 'assistant' or 'system'")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{field}.content", "Input should be a string or a list of blocks")
    for block in content:
        if isinstance(block, dict) and "cache_control" in block:
            _drop(dropped, "cache_control")
    if role == "system":  # a system turn mid-conversation: its text blocks
        return _system(content, dropped)
    if role == "assistant":
        return [_assistant(content, f"{field}.content", dropped)]
    return _user(content, f"{field}.content")


def _assistant(blocks: list[Any], field: str, dropped: list[str]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = _kind(block, f"{field}.{i}")
        if kind in ("thinking", "redacted_thinking"):
            _drop(dropped, kind)  # a chat upstream takes no earlier reasoning
        elif kind == "text":
            texts.append(_text(block, f"{field}.{i}"))
        elif kind == "tool_use":
            calls.append(_tool_use(block, f"{field}.{i}"))
        else:
            raise invalid(
                f"{field}.{i}.type", f"'{kind[:50]}' is not supported in an assistant turn"
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


def _tool_use(block: dict[str, Any], field: str) -> dict[str, Any]:
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{field}.id", "Field required")
    if not isinstance(name, str) or not name:
        raise invalid(f"{field}.name", "Field required")
    given = block.get("input", {})
    if not isinstance(given, dict):
        raise invalid(f"{field}.input", "Input should be an object")
    arguments = orjson.dumps(given).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _user(blocks: list[Any], field: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = _kind(block, f"{field}.{i}")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, f"{field}.{i}")})
        elif kind == "image":
            parts.append(_image(block, f"{field}.{i}"))
        elif kind == "tool_result":
            tools.append(_tool_result(block, f"{field}.{i}", parts))
        else:
            raise invalid(f"{field}.{i}.type", f"'{kind[:50]}' is not supported in a user turn")
    if not parts:
        return tools
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*tools, {"role": "user", "content": parts[0]["text"]}]
    return [*tools, {"role": "user", "content": parts}]


def _tool_result(block: dict[str, Any], field: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool message; images in the result go to `parts`, the user turn after it (a chat
    tool message carries only text)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{field}.tool_use_id", "Field required")
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for j, inner in enumerate(content):
            kind = _kind(inner, f"{field}.content.{j}")
            if kind == "text":
                texts.append(_text(inner, f"{field}.content.{j}"))
            elif kind == "image":
                parts.append(_image(inner, f"{field}.content.{j}"))
            else:
                raise invalid(f"{field}.content.{j}.type", "Input should be 'text' or 'image'")
        text = "\n".join(texts)
    else:
        raise invalid(f"{field}.content", "Input should be a string or a list of blocks")
    if block.get("is_error") is True:
        text = "Error: " + text  # a chat tool message has no error flag of its own
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _image(block: dict[str, Any], field: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid(f"{field}.source", "Field required")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise invalid(f"{field}.source.media_type", "Input should be an image media type")
        if not isinstance(data, str) or not data:
            raise invalid(f"{field}.source.data", "Field required")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        given = source.get("url")
        if not isinstance(given, str) or not given.startswith(("https://", "http://")):
            raise invalid(f"{field}.source.url", "Input should be an http(s) URL")
        url = given
    else:
        raise invalid(f"{field}.source.type", "Input should be 'base64' or 'url'")
    return {"type": "image_url", "image_url": {"url": url}}


def _kind(block: Any, field: str) -> str:
    if not isinstance(block, dict):
        raise invalid(field, "Input should be an object")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise invalid(f"{field}.type", "Field required")
    return kind


def _tools(tools: Any, dropped: list[str]) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools", "Input should be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools.{i}", "Input should be an object")
        if tool.get("type") not in _CLIENT_TOOL_TYPES:
            _drop(dropped, "tools." + param_name(str(tool.get("type"))))  # a server tool
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools.{i}.name", "Field required")
        if "cache_control" in tool:
            _drop(dropped, "cache_control")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid(f"tools.{i}.input_schema", "Field required")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if isinstance(description, str):
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise invalid("tool_choice", "Input should be an object")
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("tool_choice.name", "Field required")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise invalid("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    if choice.get("disable_parallel_tool_use") is True and "tools" in chat and kind != "none":
        chat["parallel_tool_calls"] = False

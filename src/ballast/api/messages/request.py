"""An Anthropic Messages request as the chat completion an upstream is sent.

Read field by field into a new chat payload (the pipeline's terms); anything unusable is a
400 naming the field the way Anthropic's API does (`messages.0.content.1.source.type`).
What a chat completion has no place for is left out and named in `dropped` (the client
learns it from the `x-ballast-dropped` header; docs/shapes.md lists them): `top_k`,
`service_tier`, `context_management`, MCP servers, a container, server tools
(`tools.<type>`: Anthropic runs them, a chat upstream cannot), and any field this
translation does not know.

Two extensions of the chat form are kept when asked (`keep`), for the providers that carry
them (providers/base.Adapter.extensions), and otherwise left out and named like the rest:
"cache_control" (the marks stay on the chat content parts, tools, tool calls and tool
messages they were on, and a marked `system` is text parts rather than one string) and
"thinking" (the `thinking` parameter as it came; an assistant turn's `thinking` and
`redacted_thinking` blocks, exactly, as its `thinking_blocks`). `kept` names the ones a
request used, so the shape can name what each deployment leaves out."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.api.messages.extensions import Notes
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
        "thinking",
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
    payload: Any,
    counting: bool = False,
    dropped: list[str] | None = None,
    keep: frozenset[str] = frozenset(),
    kept: list[str] | None = None,
) -> dict[str, Any]:
    """The chat payload for an Anthropic request body (already parsed JSON). `counting`:
    a count_tokens body, which needs no `max_tokens`. What it leaves out is appended to
    `dropped`, the extensions it carries (of those in `keep`) to `kept`, each name once."""
    notes = Notes([] if dropped is None else dropped, keep, [] if kept is None else kept)
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "Field required" if model is None else "Input should be a string")
    chat: dict[str, Any] = {"model": model}
    messages = _system(payload.get("system"), notes)
    given = payload.get("messages")
    if not isinstance(given, list):
        raise invalid("messages", "Field required" if given is None else "Input should be a list")
    if not given and not counting:
        raise invalid("messages", "at least one message is required")
    for i, message in enumerate(given):
        messages.extend(_message(message, f"messages.{i}", notes))
    chat["messages"] = messages
    if not counting:
        chat["max_tokens"] = _max_tokens(payload.get("max_tokens"))
    for name in sorted(payload.keys() - _READ):
        if payload[name] is not None:
            notes.drop(param_name(name))
    thinking = payload.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict):
            raise invalid("thinking", "Input should be an object")
        if notes.carry("thinking"):
            chat["thinking"] = thinking
    _sampling(payload, chat)
    tools = payload.get("tools")
    if tools is not None:
        chat["tools"] = _tools(tools, notes)
        if not chat["tools"] and tools:
            del chat["tools"]
    choice = payload.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, chat)
    output = payload.get("output_config")
    if output is not None:
        _output_config(output, chat, notes)
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


def _output_config(output: Any, chat: dict[str, Any], notes: Notes) -> None:
    """A JSON schema for the answer becomes the chat `response_format`; the effort level has
    no chat counterpart every upstream takes, and is left out."""
    if not isinstance(output, dict):
        raise invalid("output_config", "Input should be an object")
    if output.get("effort") is not None:
        notes.drop("output_config.effort")
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


def _system(system: Any, notes: Notes, field: str = "system") -> list[dict[str, Any]]:
    """A system message: its blocks' text joined, or its text parts where one is marked."""
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise invalid(field, "Input should be a string or a list of text blocks")
    parts = []
    marked = False
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"{field}.{i}.type", "Input should be 'text'")
        part = {"type": "text", "text": _text(block, f"{field}.{i}")}
        marked = notes.mark(block, part) or marked
        parts.append(part)
    if not parts:
        return []
    if marked:
        return [{"role": "system", "content": parts}]
    return [{"role": "system", "content": "\n".join(p["text"] for p in parts)}]


def _text(block: dict[str, Any], field: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(
            f"{field}.text", "Field required" if text is None else "Input should be a string"
        )
    return text


def _message(message: Any, field: str, notes: Notes) -> list[dict[str, Any]]:
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
    if role == "system":  # a system turn mid-conversation: its text blocks
        return _system(content, notes, f"{field}.content")
    if role == "assistant":
        return [_assistant(content, f"{field}.content", notes)]
    return _user(content, f"{field}.content", notes)


def _assistant(blocks: list[Any], field: str, notes: Notes) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[dict[str, Any]] = []
    marked = False
    for i, block in enumerate(blocks):
        kind = _kind(block, f"{field}.{i}")
        if kind in ("thinking", "redacted_thinking"):
            thought = _thought(block, kind, f"{field}.{i}")
            if notes.carry(kind):  # else: a chat upstream takes no earlier reasoning
                thoughts.append(thought)
        elif kind == "text":
            part = {"type": "text", "text": _text(block, f"{field}.{i}")}
            marked = notes.mark(block, part) or marked
            texts.append(part)
        elif kind == "tool_use":
            call = _tool_use(block, f"{field}.{i}")
            notes.mark(block, call)
            calls.append(call)
        else:
            raise invalid(
                f"{field}.{i}.type", f"'{kind[:50]}' is not supported in an assistant turn"
            )
    content: Any = texts if marked else "".join(p["text"] for p in texts) if texts else None
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    elif content is None:
        out["content"] = ""
    if thoughts:
        out["thinking_blocks"] = thoughts
    return out


def _thought(block: dict[str, Any], kind: str, field: str) -> dict[str, Any]:
    """A thinking block of an earlier turn, exactly (its signature covers its text)."""
    names = ("thinking", "signature") if kind == "thinking" else ("data",)
    for name in names:
        if not isinstance(block.get(name), str):
            raise invalid(f"{field}.{name}", "Field required")
    return {"type": kind, **{name: block[name] for name in names}}


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


def _user(blocks: list[Any], field: str, notes: Notes) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = _kind(block, f"{field}.{i}")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, f"{field}.{i}")})
        elif kind == "image":
            parts.append(_image(block, f"{field}.{i}"))
        elif kind == "tool_result":
            tools.append(_tool_result(block, f"{field}.{i}", parts, notes))
            continue
        else:
            raise invalid(f"{field}.{i}.type", f"'{kind[:50]}' is not supported in a user turn")
        notes.mark(block, parts[-1])
    if not parts:
        return tools
    if len(parts) == 1 and parts[0]["type"] == "text" and "cache_control" not in parts[0]:
        return [*tools, {"role": "user", "content": parts[0]["text"]}]
    return [*tools, {"role": "user", "content": parts}]


def _tool_result(
    block: dict[str, Any], field: str, parts: list[dict[str, Any]], notes: Notes
) -> dict[str, Any]:
    """A tool message; images in the result go to `parts`, the user turn after it (a chat
    tool message carries only text). Its text is one string, or text parts where one of
    them is marked; the result's own mark goes on the message."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{field}.tool_use_id", "Field required")
    content = block.get("content", "")
    texts: list[dict[str, Any]] = []
    marked = False
    if isinstance(content, str):
        texts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, inner in enumerate(content):
            kind = _kind(inner, f"{field}.content.{j}")
            if kind == "text":
                texts.append({"type": "text", "text": _text(inner, f"{field}.content.{j}")})
            elif kind == "image":
                parts.append(_image(inner, f"{field}.content.{j}"))
            else:
                raise invalid(f"{field}.content.{j}.type", "Input should be 'text' or 'image'")
            marked = notes.mark(inner, texts[-1] if kind == "text" else parts[-1]) or marked
    else:
        raise invalid(f"{field}.content", "Input should be a string or a list of blocks")
    error = "Error: " if block.get("is_error") is True else ""  # chat has no error flag
    if marked and texts:
        texts[0] = {**texts[0], "text": error + texts[0]["text"]}
        text: Any = texts
    else:
        text = error + "\n".join(p["text"] for p in texts)
    message = {"role": "tool", "tool_call_id": call_id, "content": text}
    notes.mark(block, message)
    return message


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


def _tools(tools: Any, notes: Notes) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools", "Input should be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools.{i}", "Input should be an object")
        if tool.get("type") not in _CLIENT_TOOL_TYPES:
            notes.drop("tools." + param_name(str(tool.get("type"))))  # a server tool
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools.{i}.name", "Field required")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid(f"tools.{i}.input_schema", "Field required")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if isinstance(description, str):
            function["description"] = description
        entry = {"type": "function", "function": function}
        notes.mark(tool, entry)
        out.append(entry)
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

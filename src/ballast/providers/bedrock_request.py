"""A chat request said as a Bedrock Converse body (the model id goes in the URL).

Converse messages are `user` and `assistant` turns of content blocks: text, image (its bytes
as base64 in the JSON wire), `toolUse` and `toolResult`; tool results ride in a user turn and
consecutive turns of one role are merged, since Converse wants the roles to alternate.

A prompt cache mark (`cache_control` on a content part, a tool call, a tool message or a
tool, as a bridged Messages request keeps them) is a `cachePoint` block right after what it
marked: in `system`, in a turn's content, or in the tools. Thinking is not carried."""

from __future__ import annotations

from typing import Any

import orjson

import ballast.providers.chat_shapes as cs

_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
CACHE_POINT = {"cachePoint": {"type": "default"}}


def _marked(given: Any) -> bool:
    return isinstance(given, dict) and given.get("cache_control") is not None


def _texts(content: Any) -> list[dict[str, Any]]:
    """A message's text as text blocks: one, or one a part with a cache point after each
    marked part."""
    parts = cs.parts(content)
    if not any(_marked(p) for p in parts):
        text = cs.text_of(parts)
        return [{"text": text}] if text else []
    out: list[dict[str, Any]] = []
    for part in parts:
        if part.get("type") == "text":
            out.append({"text": part["text"]})
            if _marked(part):
                out.append(CACHE_POINT)
    return out


def converse_body(payload: dict[str, Any]) -> dict[str, Any]:
    messages = cs.messages(payload)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_texts(message.get("content")))
            continue
        bedrock_role, blocks = _turn(message, role)
        if turns and turns[-1]["role"] == bedrock_role:
            turns[-1]["content"].extend(blocks)
        elif blocks:
            turns.append({"role": bedrock_role, "content": blocks})
    body: dict[str, Any] = {"messages": turns}
    if system:
        body["system"] = system
    config = _inference_config(payload)
    if config:
        body["inferenceConfig"] = config
    tools = _tool_config(payload)
    if tools is not None:
        body["toolConfig"] = tools
    return body


def _turn(message: dict[str, Any], role: Any) -> tuple[str, list[dict[str, Any]]]:
    if role == "user":
        blocks: list[dict[str, Any]] = []
        for part in cs.parts(message.get("content")):
            blocks.append(_block(part))
            if _marked(part):
                blocks.append(CACHE_POINT)
        return "user", blocks
    if role == "assistant":
        blocks = _texts(message.get("content"))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            use = {"toolUseId": call.get("id"), "name": function.get("name")}
            blocks.append({"toolUse": {**use, "input": cs.arguments(call)}})
            if _marked(call):
                blocks.append(CACHE_POINT)
        return "assistant", blocks
    if role == "tool":
        ident = message.get("tool_call_id")
        if not isinstance(ident, str) or not ident:
            raise cs.bad_request("a tool message needs its tool_call_id")
        blocks = [{"toolResult": {"toolUseId": ident, "content": _result(message)}}]
        content = message.get("content")
        if _marked(message) or any(_marked(p) for p in cs.seq(content)):
            blocks.append(CACHE_POINT)  # none inside a result: after it
        return "user", blocks
    raise cs.unsupported(f"message role {role!r} is not supported")


def _block(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": str(part.get("text", ""))}
    if kind == "image_url":
        inline = cs.data_url(cs.image_url(part))
        if inline is None:
            raise cs.unsupported("Bedrock takes images as data URLs only, not remote URLs")
        image_format = _FORMATS.get(inline[0])
        if image_format is None:
            raise cs.unsupported(f"Bedrock does not take images of type {inline[0]}")
        return {"image": {"format": image_format, "source": {"bytes": inline[1]}}}
    raise cs.unsupported(f"content part type {kind!r} is not supported by Bedrock")


def _result(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = cs.text_of(message.get("content"))
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return [{"text": text}]
    return [{"json": value}] if isinstance(value, dict) else [{"text": text}]


def _inference_config(payload: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    limit = cs.max_tokens(payload)
    if limit is not None:
        config["maxTokens"] = limit
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP")):
        if payload.get(ours) is not None:
            config[theirs] = payload[ours]
    stops = cs.stops(payload)
    if stops:
        config["stopSequences"] = stops
    return config


def _tool_config(payload: dict[str, Any]) -> dict[str, Any] | None:
    tools: list[dict[str, Any]] = []
    given = payload.get("tools")  # each checked by cs.functions: its function, in order
    for tool, function in zip(cs.seq(given), cs.functions(payload, "Bedrock"), strict=True):
        spec: dict[str, Any] = {
            "name": function["name"],
            "inputSchema": {"json": function.get("parameters") or {"type": "object"}},
        }
        if function.get("description"):
            spec["description"] = function["description"]
        tools.append({"toolSpec": spec})
        if _marked(tool):
            tools.append(CACHE_POINT)
    if not tools:
        return None
    config: dict[str, Any] = {"tools": tools}
    choice = payload.get("tool_choice")
    # Converse cannot forbid a tool once tools are given: "none" leaves the choice to it.
    if choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and (choice.get("function") or {}).get("name"):
        config["toolChoice"] = {"tool": {"name": choice["function"]["name"]}}
    elif choice not in (None, "none"):
        raise cs.bad_request("tool_choice must be auto, none, required or a named function")
    return config

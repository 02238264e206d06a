"""A chat request said as a Bedrock Converse body (the model id goes in the URL).

Converse messages are `user` and `assistant` turns of content blocks: text, image (its bytes
as base64 in the JSON wire), `toolUse` and `toolResult`; tool results ride in a user turn and
consecutive turns of one role are merged, since Converse wants the roles to alternate."""

from __future__ import annotations

from typing import Any

import orjson

import ballast.providers.chat_shapes as cs

_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}


def converse_body(payload: dict[str, Any]) -> dict[str, Any]:
    messages = cs.messages(payload)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            text = cs.text_of(message.get("content"))
            if text:
                system.append({"text": text})
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
        return "user", [_block(p) for p in cs.parts(message.get("content"))]
    if role == "assistant":
        text = cs.text_of(message.get("content"))
        blocks: list[dict[str, Any]] = [{"text": text}] if text else []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            use = {"toolUseId": call.get("id"), "name": function.get("name")}
            blocks.append({"toolUse": {**use, "input": cs.arguments(call)}})
        return "assistant", blocks
    if role == "tool":
        ident = message.get("tool_call_id")
        if not isinstance(ident, str) or not ident:
            raise cs.bad_request("a tool message needs its tool_call_id")
        return "user", [{"toolResult": {"toolUseId": ident, "content": _result(message)}}]
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
    tools = []
    for function in cs.functions(payload, "Bedrock"):
        spec: dict[str, Any] = {
            "name": function["name"],
            "inputSchema": {"json": function.get("parameters") or {"type": "object"}},
        }
        if function.get("description"):
            spec["description"] = function["description"]
        tools.append({"toolSpec": spec})
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

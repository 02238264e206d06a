"""A chat request said as a Gemini `generateContent` body (AI Studio and Vertex share it).

Gemini has two roles, `user` and `model`; the system prompt is `systemInstruction`, a tool
result is a `functionResponse` part that names its function, and consecutive turns of one
role are merged into one content (Gemini wants the parts of a parallel call together)."""

from __future__ import annotations

import mimetypes
from typing import Any

import orjson

import ballast.providers.chat_shapes as cs

# What Gemini's Schema (an OpenAPI 3.0 subset) knows; anything else in a JSON Schema
# (additionalProperties, $schema, strict...) is refused by Gemini, so it is left out.
_SCHEMA_KEYS = frozenset(
    {"type", "format", "title", "description", "nullable", "enum", "items", "minItems",
     "maxItems", "properties", "required", "minProperties", "maxProperties", "minLength",
     "maxLength", "pattern", "minimum", "maximum", "anyOf", "propertyOrdering", "default",
     "example"}
)  # fmt: skip

_CONFIG = (  # chat field -> generationConfig field, copied as they are
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)


def gemini_body(payload: dict[str, Any]) -> dict[str, Any]:
    messages = cs.messages(payload)
    names = cs.tool_names(messages)
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend({"text": p["text"]} for p in _text_parts(message.get("content")))
            continue
        gemini_role, parts = _turn(message, role, names)
        if contents and contents[-1]["role"] == gemini_role:
            contents[-1]["parts"].extend(parts)
        elif parts:
            contents.append({"role": gemini_role, "parts": parts})
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    tools = _tools(payload)
    if tools:
        body["tools"] = tools
    choice = _tool_config(payload.get("tool_choice"))
    if choice is not None:
        body["toolConfig"] = choice
    config = _generation_config(payload)
    if config:
        body["generationConfig"] = config
    return body


def _turn(
    message: dict[str, Any], role: Any, names: dict[str, str]
) -> tuple[str, list[dict[str, Any]]]:
    if role == "user":
        return "user", [_part(p) for p in cs.parts(message.get("content"))]
    if role == "assistant":
        parts = [{"text": p["text"]} for p in _text_parts(message.get("content")) if p["text"]]
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append(
                {"functionCall": {"name": function.get("name"), "args": cs.arguments(call)}}
            )
        return "model", parts
    if role == "tool":
        ident = message.get("tool_call_id")
        name = names.get(ident) if isinstance(ident, str) else None
        if not name:
            raise cs.bad_request("a tool message must answer a tool call made before it")
        return "user", [{"functionResponse": {"name": name, "response": _response(message)}}]
    raise cs.unsupported(f"message role {role!r} is not supported")


def _text_parts(content: Any) -> list[dict[str, Any]]:
    return [p for p in cs.parts(content) if p.get("type") == "text"]


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": str(part.get("text", ""))}
    if kind == "image_url":
        url = cs.image_url(part)
        inline = cs.data_url(url)
        if inline is not None:
            return {"inlineData": {"mimeType": inline[0], "data": inline[1]}}
        media = mimetypes.guess_type(url.split("?", 1)[0])[0] or "image/jpeg"
        return {"fileData": {"mimeType": media, "fileUri": url}}
    raise cs.unsupported(f"content part type {kind!r} is not supported by Gemini")


def _response(message: dict[str, Any]) -> dict[str, Any]:
    """A function response must be an object: a JSON object result as it is, else wrapped."""
    text = cs.text_of(message.get("content"))
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"content": text}
    return value if isinstance(value, dict) else {"content": value}


def _tools(payload: dict[str, Any]) -> list[dict[str, Any]]:
    declarations = []
    for function in cs.functions(payload, "Gemini"):
        declaration = {"name": function["name"]}
        if function.get("description"):
            declaration["description"] = function["description"]
        if function.get("parameters"):
            declaration["parameters"] = schema(function["parameters"])
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}] if declarations else []


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
    if isinstance(choice, str) and choice in modes:
        return {"functionCallingConfig": {"mode": modes[choice]}}
    if isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        name = choice["function"]["name"]
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    raise cs.bad_request("tool_choice must be auto, none, required or a named function")


def schema(value: Any) -> Any:
    """A JSON Schema said in Gemini's subset: unknown keys dropped, `type: [x, "null"]` as
    `type: x, nullable: true`, recursively through properties, items and anyOf."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in _SCHEMA_KEYS:
            continue
        if key == "properties" and isinstance(item, dict):
            out[key] = {name: schema(sub) for name, sub in item.items()}
        elif key == "items":
            out[key] = schema(item)
        elif key == "anyOf" and isinstance(item, list):
            out[key] = [schema(sub) for sub in item]
        elif key == "type" and isinstance(item, list):
            kinds = [k for k in item if k != "null"]
            out["type"] = kinds[0] if len(kinds) == 1 else item
            if "null" in item:
                out["nullable"] = True
        else:
            out[key] = item
    return out


def _generation_config(payload: dict[str, Any]) -> dict[str, Any]:
    config = {theirs: payload[ours] for ours, theirs in _CONFIG if payload.get(ours) is not None}
    limit = cs.max_tokens(payload)
    if limit is not None:
        config["maxOutputTokens"] = limit
    stops = cs.stops(payload)
    if stops:
        config["stopSequences"] = stops
    response_format = payload.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind in ("json_object", "json_schema"):
            config["responseMimeType"] = "application/json"
        wanted = cs.obj(response_format.get("json_schema")).get("schema")
        if kind == "json_schema" and isinstance(wanted, dict):
            config["responseSchema"] = schema(wanted)
    return config

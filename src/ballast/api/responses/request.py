"""A Responses API request as the chat completion the pipeline sends (the bridge). Pure
translation over plain dicts. What would make the answer one to another request than the
client made (stored state, built-in tools, background runs, an input item it does not know)
is refused with a 400 naming the parameter. What only shapes how the answer is made or
shown (a parameter the bridge does not know, `include`, `truncation`, log probabilities,
context management, earlier reasoning items, tools the provider would run) is left out
and named in `dropped`, which the client reads in the `x-ballast-dropped` header."""

from __future__ import annotations

from typing import Any

from ballast.pipeline.context import param_name
from ballast.pipeline.errors import ApiError, bad_request

# Fields that need state or machinery a chat completion has not: (name, why).
_STATEFUL = {
    "previous_response_id": "Ballast keeps no stored responses; send the whole conversation"
    " in 'input' instead",
    "conversation": "Ballast keeps no stored conversations; send the whole conversation in"
    " 'input' instead",
    "prompt": "stored prompt templates are not available through Ballast's bridge",
}
# Fields read below, and those whose whole meaning survives without being sent.
_KNOWN = frozenset(
    (
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "max_output_tokens",
        "temperature",
        "top_p",
        "reasoning",
        "metadata",
        "store",
        "parallel_tool_calls",
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "truncation",
        "include",
        "background",
        "max_tool_calls",
        "fallbacks",
        "cache",
        "prompt_cache_retention",
        "prompt_cache_options",
        "top_logprobs",
        "context_management",
        *_STATEFUL,
    )
)
_REFUSABLE = frozenset(
    (*_STATEFUL, "background", "truncation", "include", "top_logprobs", "context_management")
)
_PASSED = ("temperature", "top_p", "user", "prompt_cache_key", "service_tier")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TOOL_CHOICES = ("auto", "none", "required")


def _refuse(payload: dict[str, Any], dropped: list[str]) -> None:
    """A 400 for the first field set to something the bridge cannot honour; the names of
    those it can leave out, in `dropped`."""
    for name, why in _STATEFUL.items():
        if payload.get(name) is not None:
            raise unsupported(name, why)
    if payload.get("background"):
        raise unsupported("background", "background responses need a store Ballast does not keep")
    if payload.get("truncation") not in (None, "disabled"):
        dropped.append("truncation")  # the upstream refuses an overlong input instead
    for name in ("include", "top_logprobs", "context_management"):
        if payload.get(name):
            dropped.append(name)


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(
        400, f"'{param}' is not supported: {why}.", code="unsupported_parameter", param=param
    )


def to_chat(payload: dict[str, Any], dropped: list[str] | None = None) -> dict[str, Any]:
    """The chat completion body for a Responses request (`model` kept as given); what it
    leaves out is appended to `dropped`."""
    if dropped is None:
        dropped = []
    keys = payload.keys()
    unknown = keys - _KNOWN
    if unknown:
        dropped.extend(sorted({param_name(k) for k in unknown if payload[k] is not None}))
    if not keys.isdisjoint(_REFUSABLE):  # the usual request has none of these
        _refuse(payload, dropped)
    metadata = payload.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise bad_request("'metadata' must be an object of strings.", "metadata")
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string.", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(input_messages(payload.get("input"), dropped))
    chat: dict[str, Any] = {"model": payload["model"], "messages": messages}
    for name in _PASSED:
        if payload.get(name) is not None:
            chat[name] = payload[name]
    if payload.get("safety_identifier") is not None and "user" not in chat:
        chat["user"] = payload["safety_identifier"]
    if payload.get("max_output_tokens") is not None:
        chat["max_tokens"] = payload["max_output_tokens"]
    tools = payload.get("tools")
    if tools:
        chat["tools"] = chat_tools(tools, dropped)
        if not chat["tools"]:
            del chat["tools"]
        if payload.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = payload["parallel_tool_calls"]
    if payload.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(payload["tool_choice"])
    _text_options(payload.get("text"), chat)
    _reasoning(payload.get("reasoning"), chat)
    if payload.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # response.completed carries usage
    return chat


def input_messages(given: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """`input` (a string, or a list of items) as chat messages; earlier reasoning items,
    which chat upstreams take no part of, are left out and named."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise bad_request("'input' must be a string or a non-empty list of items.", "input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(given):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _function_call(item, where, messages)
        elif kind == "function_call_output":
            messages.append(_function_output(item, where))
        elif kind == "reasoning":
            if "input.reasoning" not in dropped:  # the model's earlier thinking
                dropped.append("input.reasoning")
        elif kind == "item_reference":
            raise unsupported(f"{where}.type", "item references need stored responses")
        else:
            raise unsupported(
                f"{where}.type",
                f"input items of type {str(kind)[:64]!r} cannot be bridged to a chat completion",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise bad_request(
            f"'{where}.role' must be user, assistant, system or developer.", f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad_request(
            f"'{where}.content' must be a string or a list of parts.", f"{where}.content"
        )
    parts = [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if role != "user":  # only a user message takes parts other than text
        if any(p["type"] != "text" for p in parts):
            raise bad_request(
                f"'{where}': only user messages can carry images.", f"{where}.content"
            )
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise bad_request(f"'{where}' must be an object.", where)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"'{where}.text' must be a string.", f"{where}.text")
        return {"type": "text", "text": text}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            if part.get("file_id") is not None:
                raise unsupported(
                    f"{where}.file_id",
                    "uploaded files are not available through the bridge; send 'image_url'",
                )
            raise bad_request(
                f"'{where}.image_url' must be a URL or a data URL.", f"{where}.image_url"
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise unsupported(
        f"{where}.type", f"content parts of type {str(kind)[:64]!r} cannot be bridged"
    )


def _function_call(item: dict[str, Any], where: str, messages: list[dict[str, Any]]) -> None:
    """A call the model made earlier: calls in a row join one assistant message, as chat
    completions give them."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise bad_request(f"'{where}' needs 'call_id', 'name' and 'arguments' as strings.", where)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    elif last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str):
        last["tool_calls"] = [call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise bad_request(f"'{where}.call_id' must be a string.", f"{where}.call_id")
    if isinstance(output, list):
        parts = [_part(p, f"{where}.output[{i}]") for i, p in enumerate(output)]
        if any(p["type"] != "text" for p in parts):
            raise unsupported(
                f"{where}.output", "a tool's output can only be text through the bridge"
            )
        output = "".join(p["text"] for p in parts)
    if not isinstance(output, str):
        raise bad_request(
            f"'{where}.output' must be a string or a list of text parts.", f"{where}.output"
        )
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def chat_tools(tools: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """Responses' flat function tools as chat's nested ones. A tool of another kind (one the
    provider runs, a namespace of tools) is left out and named `tools.<type>`."""
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list.", "tools")
    out = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise bad_request(f"'{where}' must be an object.", where)
        kind = tool.get("type")
        if kind != "function":
            named = "tools." + param_name(str(kind))
            if named not in dropped:
                dropped.append(named)
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"'{where}.name' must be a non-empty string.", f"{where}.name")
        function: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str) and choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
        raise bad_request("'tool_choice.name' must name a function.", "tool_choice.name")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        raise unsupported(
            "tool_choice.type",
            "'allowed_tools' cannot be bridged; send only the allowed tools in 'tools'",
        )
    raise unsupported("tool_choice", "only auto, none, required or a function can be bridged")


def _text_options(text: Any, chat: dict[str, Any]) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise bad_request("'text' must be an object.", "text")
    if text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]
    fmt = text.get("format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
        return
    if kind != "json_schema":
        raise bad_request(
            "'text.format.type' must be text, json_object or json_schema.", "text.format.type"
        )
    assert isinstance(fmt, dict)
    if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise bad_request("'text.format' needs a 'name' and a 'schema' object.", "text.format")
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    chat["response_format"] = {"type": "json_schema", "json_schema": schema}


def _reasoning(reasoning: Any, chat: dict[str, Any]) -> None:
    """`reasoning.effort` is chat's `reasoning_effort`; `summary` asks only how the model's
    thinking is shown, and the bridge shows what the upstream gives."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise bad_request("'reasoning' must be an object.", "reasoning")
    effort = reasoning.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise bad_request("'reasoning.effort' must be a string.", "reasoning.effort")
        chat["reasoning_effort"] = effort

"""The simulator's OpenAI Responses wire (`POST /v1/responses`): its requests read, its
whole answers and its numbered streaming events made, from the same deterministic answers
as the chat endpoint. Written from the API's documentation, independently of the gateway's
bridge, so the official SDK pointed at it proves the wire and not a shared mistake."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.sim.agent import encrypted_reasoning, reasoning_problem, wants_encrypted_reasoning
from ballast.sim.answer import Answer, content_text
from ballast.sim.bodies import TOOL_NAME, Ids, tool_arguments, tool_call_id


class BadInput(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as role/content messages (what the answer is computed from)."""
    problem = reasoning_problem(body)
    if problem is not None:
        raise BadInput(problem + " (sim)", "input")
    given = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise BadInput("'input' must be a string or a non-empty array (sim)", "input")
    for index, item in enumerate(given):
        if not isinstance(item, dict):
            raise BadInput(f"input[{index}] must be an object (sim)", f"input[{index}]")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(
                {"role": item.get("role"), "content": content_text(item.get("content"))}
            )
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output"))})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None, "tool": True})
        elif kind != "reasoning":
            raise BadInput(f"unknown input item type {kind!r} (sim)", f"input[{index}].type")
    return messages


def max_output_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise BadInput(
            "max_output_tokens must be an integer of at least 16 (sim)", "max_output_tokens"
        )
    return value


def usage_of(answer: Answer) -> dict[str, Any]:
    """A Response's usage: the cache's reads and writes are parts of `input_tokens`, the
    reasoning of `output_tokens`."""
    output = answer.completion_tokens + answer.thinking
    details = {"cached_tokens": answer.cached, "cache_write_tokens": answer.writes}
    return {
        "input_tokens": answer.prompt_tokens,
        "input_tokens_details": details,
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": answer.thinking},
        "total_tokens": answer.prompt_tokens + output,
    }


def _response(ids: Ids, body: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "id": f"resp_sim{ids.number}",
        "object": "response",
        "created_at": ids.created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": ids.model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "usage": None,
    }


def _reasoned(body: dict[str, Any], shape: str) -> bool:
    """A tool call made with reasoning the client keeps (encrypted: `store: false`)."""
    return shape == "tool" and wants_encrypted_reasoning(body)


def _reasoning_item(ids: Ids) -> dict[str, Any]:
    return {
        "id": f"rs_sim{ids.number}",
        "type": "reasoning",
        "summary": [],
        "encrypted_content": encrypted_reasoning(ids.number),
    }


def _item(ids: Ids, shape: str, text: str, status: str, reasoned: bool = False) -> dict[str, Any]:
    if shape == "tool":
        return {
            "id": f"fc_sim{ids.number}",
            "type": "function_call",
            "status": status,
            "call_id": f"call_sim_r{ids.number}" if reasoned else tool_call_id(ids),
            "name": TOOL_NAME,
            "arguments": text,
        }
    if shape == "reasoning":
        content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
        return {"id": f"rs_sim{ids.number}", "type": "reasoning", "summary": [], "content": content}
    content = [_text_part(text)] if status != "in_progress" else []  # text and json
    return {
        "id": f"msg_sim{ids.number}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _pieces(answer: Answer, shape: str) -> list[str]:
    """The streamed pieces: a JSON object for a tool's arguments and for JSON output."""
    return tool_arguments(answer.pieces) if shape in ("tool", "json") else list(answer.pieces)


def _final(ids: Ids, body: dict[str, Any], answer: Answer, shape: str) -> dict[str, Any]:
    cut = answer.finish_reason == "length"
    response = _response(ids, body, "incomplete" if cut else "completed")
    if cut:
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    item_status = "incomplete" if cut else "completed"
    reasoned = _reasoned(body, shape)
    item = _item(ids, shape, "".join(_pieces(answer, shape)), item_status, reasoned)
    response["output"] = [_reasoning_item(ids), item] if reasoned else [item]
    response["usage"] = usage_of(answer)
    return response


def response_body(ids: Ids, body: dict[str, Any], answer: Answer, shape: str) -> dict[str, Any]:
    return _final(ids, body, answer, shape)


class _Events:
    def __init__(self) -> None:
        self.events: list[bytes] = []

    def add(self, kind: str, data: dict[str, Any]) -> None:
        data = {"type": kind, "sequence_number": len(self.events), **data}
        self.events.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")


def stream_events(
    ids: Ids, body: dict[str, Any], answer: Answer, shape: str
) -> tuple[list[bytes], int]:
    """Every event of the stream, and the index of the first one that carries a token."""
    out = _Events()
    opening = _response(ids, body, "in_progress")
    out.add("response.created", {"response": opening})
    out.add("response.in_progress", {"response": opening})
    reasoned = _reasoned(body, shape)
    at = 0
    if reasoned:  # the reasoning item comes whole, ahead of the call
        reasoning = _reasoning_item(ids)
        out.add("response.output_item.added", {"output_index": 0, "item": reasoning})
        out.add("response.output_item.done", {"output_index": 0, "item": reasoning})
        at = 1
    item = _item(ids, shape, "", "in_progress", reasoned)
    where = {"item_id": item["id"], "output_index": at}
    out.add("response.output_item.added", {"output_index": at, "item": item})
    pieces = _pieces(answer, shape)
    text = "".join(pieces)
    if shape == "tool":
        first = len(out.events)
        for piece in pieces:
            out.add("response.function_call_arguments.delta", {**where, "delta": piece})
        out.add("response.function_call_arguments.done", {**where, "arguments": text})
    else:
        plain = shape != "reasoning"
        part = _text_part("") if plain else {"type": "reasoning_text", "text": ""}
        out.add("response.content_part.added", {**where, "content_index": 0, "part": part})
        first = len(out.events)
        delta = "response.output_text" if plain else "response.reasoning_text"
        extra: dict[str, Any] = {"logprobs": []} if plain else {}
        for piece in pieces:
            out.add(f"{delta}.delta", {**where, "content_index": 0, "delta": piece, **extra})
        out.add(f"{delta}.done", {**where, "content_index": 0, "text": text, **extra})
        done_part = _text_part(text) if plain else {"type": "reasoning_text", "text": text}
        out.add("response.content_part.done", {**where, "content_index": 0, "part": done_part})
    final = _final(ids, body, answer, shape)
    out.add("response.output_item.done", {"output_index": at, "item": final["output"][at]})
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
    out.add(kind, {"response": final})
    return out.events, first

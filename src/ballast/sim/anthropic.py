"""The simulator speaking Anthropic's Messages API: `POST /v1/messages`, whole and streamed,
with the usual fault menu, and `POST /v1/messages/count_tokens` (a deterministic count).
The same behaviour specs as the OpenAI wire, in Anthropic's terms: `429` is a
`rate_limit_error`, `500` an `api_error`, `503` the 529 `overloaded_error`,
`context_length` a "prompt is too long", `content_filter` an answer that stops with
`refusal`; `malformed` breaks an event, `cut`/`stall` act after `after` text deltas,
`error_event` sends an `overloaded_error` event after `after` text deltas, and `no_done`
ends the stream without `message_stop`.

Strict where agents depend on it (agent.py): with thinking on, an answer opens with a signed
thinking block (its signature in a `signature_delta` when streamed), and a conversation whose
thinking blocks were altered or lost on a tool turn, or that ends in an assistant prefill
while thinking is on, is refused with Anthropic's 400."""

from __future__ import annotations

import math
import time
from typing import Any

import orjson
from aiohttp import web

from ballast.sim.admin import json_response
from ballast.sim.agent import (
    THINKING_TEXT,
    agent_call,
    sign,
    thinking_problem,
    thinks,
    tool_results,
)
from ballast.sim.answer import Answer, billed, chat_answer
from ballast.sim.behaviour import Behaviour
from ballast.sim.bodies import TOOL_NAME, format_retry_after, tool_arguments
from ballast.sim.conn import close, pause, reset
from ballast.sim.prompt_cache import anthropic_blocks, marks
from ballast.sim.state import SIM_STATE, seen_headers

BEHAVIOUR_HEADER = "x-sim-behaviour"
_ERRORS = frozenset({"429", "500", "503", "context_length", "409", "401"})
_STOP = {"stop": "end_turn", "length": "max_tokens"}
_ROLES = ("user", "assistant", "system")
_CREDENTIALS = ("x-api-key", "authorization")
_ERROR_EVENT = (
    b"event: error\ndata: "
    b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded (sim)"}}\n\n'
)


def error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json_response(body, status, headers)


def _fault(behaviour: Behaviour, prompt_tokens: int) -> web.Response:
    name = behaviour.name
    if name == "429":
        headers: dict[str, str] = {}
        if behaviour.retry_after is not None:
            headers["retry-after"] = format_retry_after(behaviour.retry_after)
        return error(
            429,
            "rate_limit_error",
            "Number of requests has exceeded your rate limit (sim)",
            headers,
        )
    if name == "500":
        return error(500, "api_error", "Internal server error (sim)")
    if name == "503":
        return error(529, "overloaded_error", "Overloaded (sim)")
    if name == "context_length":
        return error(
            400,
            "invalid_request_error",
            f"prompt is too long: {max(prompt_tokens, 9)} tokens > 8 maximum (sim)",
        )
    if name == "401":
        return error(401, "authentication_error", "invalid x-api-key (sim)")
    return error(409, "invalid_request_error", f"Conflict (sim: {behaviour.code})")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's turns in the shape `chat_answer` reads (system text counts as prompt)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: at least one message is required")
    for message in messages:
        # A system turn mid-conversation is what Anthropic's newer clients send too.
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ValueError("messages: each message needs role user, assistant or system")
    last = messages[-1]
    if last.get("role") == "assistant":
        content = last.get("content")
        text = (
            content
            if isinstance(content, str)
            else "".join(b.get("text", "") for b in content or () if isinstance(b, dict))
        )
        if text != text.rstrip():
            raise ValueError("final assistant content cannot end with trailing whitespace")
    system = body.get("system")
    head = [{"role": "system", "content": system}] if system else []
    return head + messages


Call = tuple[str, dict[str, Any]]  # a tool's name and input


def _turn(body: dict[str, Any], behaviour: Behaviour, answer: Answer) -> tuple[str, Call | None]:
    """The answer's shape (text, tool, reasoning) and the tool call it makes, if any."""
    shape = behaviour.shape
    if shape == "agent":
        done = len(tool_results(body)) >= behaviour.calls
        offered = None if done else agent_call(body, behaviour.tool, behaviour.arg)
        return ("text", None) if offered is None else ("tool", (behaviour.tool, offered))
    if shape == "tool":
        return shape, (TOOL_NAME, orjson.loads("".join(tool_arguments(answer.pieces))))
    return shape, None


def _thinking_block() -> dict[str, Any]:
    return {"type": "thinking", "thinking": THINKING_TEXT, "signature": sign(THINKING_TEXT)}


def _content(
    answer: Answer, shape: str, number: int, call: Call | None, thinking: bool
) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if thinking or shape == "reasoning":
        blocks.append(_thinking_block())
    if call is not None:
        name, arguments = call
        use = {"type": "tool_use", "id": f"toolu_sim_{number}", "name": name, "input": arguments}
        return [*blocks, use]
    blocks.append({"type": "text", "text": answer.text})
    return blocks


def _stop_reason(answer: Answer, shape: str, refused: bool) -> str:
    if refused:
        return "refusal"
    if shape == "tool" and answer.finish_reason == "stop":
        return "tool_use"
    return _STOP.get(answer.finish_reason, "end_turn")


def _message(
    number: int,
    model: str,
    answer: Answer,
    shape: str,
    refused: bool,
    call: Call | None = None,
    thinking: bool = False,
    inputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": f"msg_sim_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [] if refused else _content(answer, shape, number, call, thinking),
        "stop_reason": _stop_reason(answer, shape, refused),
        "stop_sequence": None,
        "usage": usage_of(answer, inputs, refused),
    }


def usage_of(answer: Answer, inputs: dict[str, Any] | None, refused: bool) -> dict[str, Any]:
    """The answer's usage as Anthropic reports it: `inputs` (the prompt cache's figures) and
    every output token, thinking included and named apart."""
    usage = {**(inputs or {"input_tokens": answer.prompt_tokens})}
    usage["output_tokens"] = 0 if refused else answer.completion_tokens + answer.thinking
    if answer.thinking and not refused:
        usage["output_tokens_details"] = {"thinking_tokens": answer.thinking}
    return usage


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def _thinking_events() -> list[bytes]:
    """A thinking block as Anthropic streams it: its text, then its signature."""
    start = {"type": "thinking", "thinking": "", "signature": ""}
    text = {"type": "thinking_delta", "thinking": THINKING_TEXT}
    signature = {"type": "signature_delta", "signature": sign(THINKING_TEXT)}
    return [
        _event("content_block_start", {"index": 0, "content_block": start}),
        _event("content_block_delta", {"index": 0, "delta": text}),
        _event("content_block_delta", {"index": 0, "delta": signature}),
        _event("content_block_stop", {"index": 0}),
    ]


def _events(
    number: int,
    model: str,
    answer: Answer,
    shape: str,
    refused: bool,
    call: Call | None = None,
    thinking: bool = False,
    inputs: dict[str, Any] | None = None,
) -> tuple[list[bytes], int]:
    """The stream's events and the index of its first content delta."""
    start = _message(number, model, answer, shape, refused)
    start.update(content=[], stop_reason=None)
    start["usage"] = {**(inputs or {"input_tokens": answer.prompt_tokens}), "output_tokens": 1}
    out = [_event("message_start", {"message": start})]
    index = 0
    if (shape == "reasoning" or thinking) and not refused:
        out.extend(_thinking_events())
        index = 1
    if call is not None:
        name, arguments = call
        block = {"type": "tool_use", "id": f"toolu_sim_{number}", "name": name, "input": {}}
        given = orjson.dumps(arguments).decode()
        pieces = tool_arguments(answer.pieces) if name == TOOL_NAME else [given]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in answer.pieces]
    out.append(_event("content_block_start", {"index": index, "content_block": block}))
    out.append(_event("ping", {}))
    first = len(out)
    if not refused:
        out.extend(_event("content_block_delta", {"index": index, "delta": d}) for d in deltas)
    out.append(_event("content_block_stop", {"index": index}))
    # The counts so far, as Anthropic's message_delta gives them (no `cache_creation`).
    usage = usage_of(answer, inputs, refused)
    usage.pop("cache_creation", None)
    delta = {"stop_reason": _stop_reason(answer, shape, refused), "stop_sequence": None}
    out.append(_event("message_delta", {"delta": delta, "usage": usage}))
    out.append(_event("message_stop", {}))
    return out, first


def _refusal(request: web.Request) -> web.Response | None:
    """Anthropic's answer to a request without its credential or version header."""
    bearer = request.headers.get("authorization", "").startswith("Bearer ")
    if not request.headers.get("x-api-key") and not bearer:
        return error(401, "authentication_error", "x-api-key header is required (sim)")
    if not request.headers.get("anthropic-version"):
        return error(400, "invalid_request_error", "anthropic-version header is required (sim)")
    return None


def _read(raw: bytes) -> tuple[dict[str, Any], str, int]:
    """The body, its model and its max_tokens; ValueError naming what is wrong."""
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the body must be an object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model: field required")
    limit = body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError("max_tokens: field required")
    return body, model, limit


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    spec = request.headers.get(BEHAVIOUR_HEADER)
    headers = seen_headers(request, _CREDENTIALS, ("anthropic-version", "anthropic-beta"))
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        body, model, limit = _read(await request.read())
        rule = state.select(model, spec)
        behaviour = rule.behaviour
        answer = billed(chat_answer(_messages(body), behaviour.tokens, limit), behaviour)
    except ValueError as exc:  # orjson's JSONDecodeError is one
        state.record(model=None, path=request.path, behaviour=spec, outcome="bad_request",
                     stream=False, prefill=False, headers=headers)  # fmt: skip
        return error(400, "invalid_request_error", f"{exc} (sim)")
    except ConnectionError:
        return web.Response()
    stream = body.get("stream") is True
    outcome = behaviour.name
    if behaviour.is_error_mode and not rule.should_fail(model):
        outcome = "ok"
    # A failing deployment fails whatever it is asked; one that answers reads the thinking.
    problem = None if outcome in _ERRORS else thinking_problem(body)
    if problem is not None:
        outcome = "bad_request"
    entry = state.record(model=model, path=request.path, behaviour=behaviour.spec, outcome=outcome,
                         stream=stream, prefill=answer.prefill, headers=headers)  # fmt: skip
    entry["fields"] = sorted(body)
    entry["cache_marks"] = marks(anthropic_blocks(body))
    if behaviour.shape == "agent":  # what came back from the tools, for the tests to read
        entry["tool_results"] = tool_results(body)
    if problem is not None:
        return error(400, "invalid_request_error", f"{problem} (sim)")
    if outcome in _ERRORS:
        return _fault(behaviour, answer.prompt_tokens)
    if outcome == "reset":
        reset(request)
        return web.Response()
    if outcome == "hang":
        await pause(request, math.inf)
        entry["disconnected"] = True
        return web.Response()
    before = behaviour.latency + (behaviour.first_token_delay if outcome == "slow_first" else 0.0)
    if not stream and outcome == "stall":
        before += behaviour.seconds
    if before > 0 and not await pause(request, before):
        entry["disconnected"] = True
        return web.Response()
    number = state.next_id()
    refused = outcome == "content_filter"
    shape, call = _turn(body, behaviour, answer)
    thinking = thinks(body)
    inputs = state.prompt_cache.usage(body, answer)
    entry["usage"] = usage_of(answer, inputs, refused)  # what the provider reports
    if not stream:
        entry["tokens"] = 0 if refused else answer.completion_tokens
        message = _message(number, model, answer, shape, refused, call, thinking, inputs)
        data = orjson.dumps(message)
        return web.Response(
            body=b"{not json" if outcome == "malformed" else data, content_type="application/json"
        )
    events, first = _events(number, model, answer, shape, refused, call, thinking, inputs)
    return await _stream(request, entry, behaviour, outcome, events, first)


async def count_tokens(request: web.Request) -> web.Response:
    """`POST /v1/messages/count_tokens`: the prompt's words (system and messages), the input
    a message with this body reports; the error faults of a message (`429`, `500`, ...)."""
    state = request.app[SIM_STATE]
    spec = request.headers.get(BEHAVIOUR_HEADER)
    headers = seen_headers(request, _CREDENTIALS, ("anthropic-version", "anthropic-beta"))
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = orjson.loads(await request.read())
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            raise ValueError("model: field required")
        prompt_tokens = chat_answer(_messages(body), 0).prompt_tokens
        rule = state.select(model, spec)
    except ValueError as exc:  # orjson's JSONDecodeError is one
        state.record(model=None, path=request.path, behaviour=spec, outcome="bad_request",
                     stream=False, prefill=False, headers=headers)  # fmt: skip
        return error(400, "invalid_request_error", f"{exc} (sim)")
    outcome = rule.behaviour.name
    if outcome not in _ERRORS or (rule.behaviour.is_error_mode and not rule.should_fail(model)):
        outcome = "ok"
    entry = state.record(model=model, path=request.path, behaviour=rule.behaviour.spec,
                         outcome=outcome, stream=False, prefill=False, headers=headers)  # fmt: skip
    entry["fields"] = sorted(body)
    if outcome in _ERRORS:
        return _fault(rule.behaviour, prompt_tokens)
    return json_response({"input_tokens": prompt_tokens})


async def _stream(
    request: web.Request,
    entry: dict[str, Any],
    behaviour: Behaviour,
    outcome: str,
    events: list[bytes],
    first: int,
) -> web.StreamResponse:
    fault_at = first + behaviour.after
    response = web.StreamResponse(
        headers={"Cache-Control": "no-cache", "request-id": f"req_sim_{time.monotonic_ns()}"}
    )
    response.content_type = "text/event-stream"
    if outcome == "no_done":
        events = events[:-1]
        response.force_close()
    try:
        await response.prepare(request)
        for index, event in enumerate(events):
            if outcome == "cut" and index == fault_at:
                close(request)
                return response
            if outcome == "error_event" and index == fault_at:
                await response.write(_ERROR_EVENT)
                await response.write_eof()
                return response
            wait = (
                behaviour.first_token_delay
                if index == first
                else behaviour.delay
                if index > first
                else 0.0
            )
            if outcome == "slow_first":
                wait = 0.0 if index == first else behaviour.delay if index > first else 0.0
            if outcome == "stall" and index == fault_at:
                wait += behaviour.seconds
            if wait > 0 and not await pause(request, wait):
                raise ConnectionResetError("client went away")
            if outcome == "malformed" and index == first + behaviour.at:
                event = b"event: content_block_delta\ndata: {not json\n\n"
            await response.write(event)
            if index >= first and b'"content_block_delta"' in event:
                entry["tokens"] += 1
        await response.write_eof()
    except ConnectionError:
        entry["disconnected"] = True
    return response

"""The Bedrock wire of the simulator: `/model/{modelId}/converse` (JSON) and
`/model/{modelId}/converse-stream` (binary `application/vnd.amazon.eventstream` frames).

Requests must carry a SigV4 `Authorization` header (its signature is not checked: the
simulator only needs to see that the gateway signs). Errors are named by `x-amzn-ErrorType`
as AWS does; an exception after a stream has started is an `exception` frame."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import orjson
from aiohttp import web

from ballast.sim.answer import Answer
from ballast.sim.behaviour import Behaviour
from ballast.sim.bodies import TOOL_NAME, Ids, format_retry_after, tool_arguments
from ballast.sim.native import BadCall, NativeCall, handle
from ballast.sim.prompt_cache import converse_blocks, marks, prefixes

_ERRORS = {
    "429": (429, "ThrottlingException", "Too many requests, please wait before trying again."),
    "500": (500, "InternalServerException", "The server encountered an internal error."),
    "503": (503, "ServiceUnavailableException", "The service is temporarily unavailable."),
    "409": (409, "ConflictException", "The request conflicts with the current state."),
    "401": (403, "UnrecognizedClientException", "The security token included is invalid."),
    "context_length": (400, "ValidationException", "Input is too long for requested model."),
}
_STOP = {"stop": "end_turn", "length": "max_tokens"}


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers and both CRCs."""
    head = b""
    for name, value in headers.items():
        raw = value.encode()
        head += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw)) + raw
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(name: str, payload: dict[str, Any]) -> bytes:
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, orjson.dumps({**payload, "p": "abcdefgh"}))  # AWS pads with `p`


def _error_json(message: str) -> bytes:
    return orjson.dumps({"message": f"{message} (sim)"})


class BedrockWire:
    stream_type = "application/vnd.amazon.eventstream"

    def error(self, behaviour: Behaviour, answer: Answer) -> tuple[int, bytes, dict[str, str]]:
        status, name, message = _ERRORS[behaviour.name]
        headers = {
            "x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"
        }
        if behaviour.name == "429" and behaviour.retry_after is not None:
            headers["Retry-After"] = format_retry_after(behaviour.retry_after)
        return status, _error_json(message), headers

    def bad_request(self, message: str) -> tuple[int, bytes, dict[str, str]]:
        headers = {"x-amzn-ErrorType": "ValidationException:http://internal.amazon.com/"}
        return 400, _error_json(message), headers

    def whole(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> bytes:
        stop = _stop(answer, behaviour)
        if behaviour.name == "content_filter":
            content: list[dict[str, Any]] = [{"text": "Sorry, the model cannot answer this."}]
        elif behaviour.shape == "tool":
            use = {"toolUseId": _tool_id(ids), "name": TOOL_NAME, "input": {"q": answer.text}}
            content = [{"toolUse": use}]
        else:
            content = [{"text": answer.text}]
        return orjson.dumps(
            {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": stop,
                "usage": _usage(answer, answer.completion_tokens),
                "metrics": {"latencyMs": 1},
            }
        )

    def events(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> list[bytes]:
        events = [event("messageStart", {"role": "assistant"})]
        pieces = [] if behaviour.name == "content_filter" else list(answer.pieces)
        if behaviour.shape == "tool" and behaviour.name != "content_filter":
            start = {"toolUse": {"toolUseId": _tool_id(ids), "name": TOOL_NAME}}
            events.append(event("contentBlockStart", {"contentBlockIndex": 0, "start": start}))
            deltas: list[dict[str, Any]] = [
                {"toolUse": {"input": p}} for p in tool_arguments(pieces)
            ]
        else:
            deltas = [{"text": piece} for piece in pieces]
        events += [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": d}) for d in deltas]
        events.append(event("contentBlockStop", {"contentBlockIndex": 0}))
        events.append(event("messageStop", {"stopReason": _stop(answer, behaviour)}))
        metadata = {"usage": _usage(answer, len(pieces)), "metrics": {"latencyMs": 1}}
        events.append(event("metadata", metadata))
        return events

    def usage(self, answer: Answer) -> dict[str, Any]:
        return _usage(answer, answer.completion_tokens)

    def opening(self, behaviour: Behaviour) -> int:
        return 2 if behaviour.shape == "tool" and behaviour.name != "content_filter" else 1

    def closing(self, behaviour: Behaviour) -> int:
        return 3

    def malformed(self) -> bytes:
        return frame({":event-type": "contentBlockDelta", ":message-type": "event"}, b"{not json")

    def error_event(self) -> bytes:
        headers = {
            ":message-type": "exception",
            ":exception-type": "serviceUnavailableException",
            ":content-type": "application/json",
        }
        return frame(headers, _error_json("The service is temporarily unavailable."))

    def corrupt(self, data: bytes) -> bytes:
        return data[:-4] + struct.pack(">I", zlib.crc32(data[:-4]) ^ 0xFFFFFFFF)


def _stop(answer: Answer, behaviour: Behaviour) -> str:
    if behaviour.name == "content_filter":
        return "content_filtered"
    stop = _STOP.get(answer.finish_reason, "end_turn")
    return "tool_use" if behaviour.shape == "tool" and stop == "end_turn" else stop


def _usage(answer: Answer, emitted: int) -> dict[str, int]:
    """Bedrock's usage: like Anthropic's, `inputTokens` leaves out what the prompt cache read
    and wrote (one figure for writes, however long kept); reasoning is in `outputTokens`."""
    prompt = answer.prompt_tokens
    output = emitted + answer.thinking
    usage = {
        "inputTokens": prompt - answer.cached - answer.writes,
        "outputTokens": output,
        "totalTokens": prompt + output,
    }
    if answer.cached or answer.writes:
        usage["cacheReadInputTokens"] = answer.cached
        usage["cacheWriteInputTokens"] = answer.writes
    return usage


def _tool_id(ids: Ids) -> str:
    return f"tooluse_sim_{ids.number}"


WIRE = BedrockWire()


def _call(body: Any, model: str, stream: bool, token: str | None) -> NativeCall | BadCall:
    if not isinstance(body, dict):
        return BadCall("The request body must be a JSON object")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        return BadCall("messages: at least one message is required")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        messages.append({"role": "system", "content": _text(system)})
    for turn in turns:
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            return BadCall("messages: each role must be user or assistant")
        if not isinstance(turn.get("content"), list) or not turn["content"]:
            return BadCall("messages: each content must be a non-empty list")
        messages.append({"role": turn["role"], "content": _text(turn["content"])})
    if messages[-1]["role"] != "user" and not messages[-1]["content"]:
        return BadCall("messages: the final assistant turn needs text")
    config = body.get("inferenceConfig") or {}
    limit = config.get("maxTokens") if isinstance(config, dict) else None
    blocks = converse_blocks(body)
    return NativeCall(
        model,
        messages,
        limit if isinstance(limit, int) else None,
        stream,
        token,
        cache_prefixes=prefixes(blocks),
        cache_marks=tuple(marks(blocks)),
    )


def _text(blocks: list[Any]) -> str:
    texts = []
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block, dict) and "toolResult" in block:
            texts.append(orjson.dumps(block["toolResult"]).decode())
    return "".join(texts)


async def _serve(request: web.Request, stream: bool) -> web.StreamResponse:
    auth = request.headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 ") or "x-amz-date" not in request.headers:
        headers = {"x-amzn-ErrorType": "MissingAuthenticationTokenException"}
        body = _error_json("Missing Authentication Token")
        return web.Response(status=403, body=body, content_type="application/json", headers=headers)
    credential = auth.partition("Credential=")[2].partition("/")[0] or None
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return await handle(request, WIRE, BadCall("The request body is not JSON"))
    return await handle(request, WIRE, _call(body, request.match_info["model"], stream, credential))


async def _converse(request: web.Request) -> web.StreamResponse:
    return await _serve(request, False)


async def _converse_stream(request: web.Request) -> web.StreamResponse:
    return await _serve(request, True)


def add_bedrock_routes(app: web.Application) -> None:
    app.router.add_post("/model/{model}/converse", _converse)
    app.router.add_post("/model/{model}/converse-stream", _converse_stream)

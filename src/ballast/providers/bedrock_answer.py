"""Bedrock Converse answers, ConverseStream events and errors said in the chat wire.

ConverseStream is a sequence of typed events in event-stream frames: messageStart, for each
content block contentBlockStart (tool use only) / contentBlockDelta / contentBlockStop, then
messageStop with the stop reason and metadata with the usage. An exception arrives in the
stream as a frame of message type `exception` named by `:exception-type`."""

from __future__ import annotations

import re
from typing import Any

import orjson

import ballast.providers.chat_shapes as cs
from ballast.resilience.failures import (
    BAD_RESPONSE,
    CLIENT_ERROR,
    CONTEXT_LENGTH,
    RATE_LIMITED,
    SERVER_ERROR,
    UPSTREAM_AUTH,
    Failure,
    Kind,
    classify_status,
)
from ballast.stream.usage import Usage, chat_usage
from ballast.upstream.eventstream import Frame

Ids = tuple[str, int, str]

_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
_KINDS = {
    "throttlingexception": RATE_LIMITED,
    "servicequotaexceededexception": RATE_LIMITED,
    "serviceunavailableexception": SERVER_ERROR,
    "modelnotreadyexception": SERVER_ERROR,
    "internalserverexception": SERVER_ERROR,
    "modelstreamerrorexception": SERVER_ERROR,
    "modeltimeoutexception": SERVER_ERROR,
    "accessdeniedexception": UPSTREAM_AUTH,
    "unrecognizedclientexception": UPSTREAM_AUTH,
    "expiredtokenexception": UPSTREAM_AUTH,
    "validationexception": CLIENT_ERROR,
}
_CONTEXT_WORDING = re.compile(
    r"too long|too many (input )?tokens|context (window|length)|maximum context", re.IGNORECASE
)


def whole(data: Any, ids: Ids) -> dict[str, Any]:
    """A whole Converse answer as a `chat.completion`."""
    if not isinstance(data, dict):
        raise cs.failure(BAD_RESPONSE, "Bedrock answered something that is not an object")
    message = cs.obj(cs.obj(data.get("output")).get("message"))
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in cs.seq(message.get("content")):
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        use = block.get("toolUse")
        if isinstance(use, dict):
            calls.append(
                cs.tool_call(str(use.get("toolUseId")), str(use.get("name")), use.get("input"))
            )
    finish = _STOP.get(str(data.get("stopReason")), "stop")
    text = "".join(texts)
    return cs.answer(ids, text if text or not calls else None, calls, finish, _usage(data))


class ConverseStream:
    """Turns ConverseStream frames into chat chunks, one state per stream."""

    __slots__ = ("_finished", "_ids", "_tools", "_trim", "_usage")

    def __init__(self, ids: Ids, trim: bool = False) -> None:
        self._ids = ids
        # The prefill went without its trailing whitespace (Converse refuses it for Claude),
        # so the answer starts with that whitespace again: the client already has it.
        self._trim = trim
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._finished = False
        self._usage: dict[str, Any] | None = None

    def feed(self, frame: Frame) -> list[dict[str, Any]]:
        kind = frame.header(":message-type") or "event"
        if kind != "event":
            raise _stream_failure(frame)
        event = frame.header(":event-type")
        try:
            data = orjson.loads(frame.payload) if frame.payload else {}
        except orjson.JSONDecodeError:
            raise cs.failure(
                BAD_RESPONSE, f"Bedrock sent a {event} event that is not JSON"
            ) from None
        if not isinstance(data, dict):
            raise cs.failure(BAD_RESPONSE, f"Bedrock sent a {event} event that is not an object")
        return self._event(event, data)

    def _event(self, event: str | None, data: dict[str, Any]) -> list[dict[str, Any]]:
        if event == "messageStart":
            return [cs.chunk(self._ids, {"role": "assistant", "content": ""})]
        if event == "contentBlockStart":
            use = cs.obj(data.get("start")).get("toolUse")
            if not isinstance(use, dict):
                return []
            index = len(self._tools)
            self._tools[cs.count(data.get("contentBlockIndex", index))] = index
            call = cs.tool_call(str(use.get("toolUseId")), str(use.get("name")), "")
            return [cs.chunk(self._ids, {"tool_calls": [{"index": index, **call}]})]
        if event == "contentBlockDelta":
            return self._delta(data)
        if event == "messageStop":
            self._finished = True
            finish = _STOP.get(str(data.get("stopReason")), "stop")
            return [cs.chunk(self._ids, {}, finish)]
        if event == "metadata":
            self._usage = _usage(data) or self._usage
        return []  # contentBlockStop, and events this translation does not use

    def _delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        delta = cs.obj(data.get("delta"))
        if isinstance(delta.get("text"), str):
            text = delta["text"]
            if self._trim:
                text = text.lstrip()
                self._trim = not text
            return [cs.chunk(self._ids, {"content": text})] if text else []
        use = delta.get("toolUse")
        if isinstance(use, dict):
            index = self._tools.get(cs.count(data.get("contentBlockIndex")))
            if index is None:
                raise cs.failure(BAD_RESPONSE, "Bedrock sent tool input for no tool block")
            piece = {"index": index, "function": {"arguments": str(use.get("input", ""))}}
            return [cs.chunk(self._ids, {"tool_calls": [piece]})]
        return []  # reasoning deltas are not the answer

    @property
    def finished(self) -> bool:
        return self._finished

    def end(self, include_usage: bool) -> list[dict[str, Any]]:
        """The usage chunk that closes a finished stream, when the client asked for one. A
        stream that ended unfinished owes nothing: the transport reports it as a cut."""
        if not self._finished:
            return []
        if include_usage and self._usage is not None:
            return [cs.usage_chunk(self._ids, self._usage)]
        return []


def _usage(data: dict[str, Any]) -> dict[str, Any] | None:
    """Bedrock's usage as chat's: like Anthropic's, `inputTokens` counts neither the tokens
    read from the prompt cache (`cacheReadInputTokens`) nor those written to it
    (`cacheWriteInputTokens`), which are prompt tokens all the same."""
    usage = data.get("usage")
    if not isinstance(usage, dict) or "inputTokens" not in usage:
        return None
    cached = cs.count(usage.get("cacheReadInputTokens"))
    written = cs.count(usage.get("cacheWriteInputTokens"))
    prompt = cs.count(usage["inputTokens"]) + cached + written
    return chat_usage(Usage(prompt, cs.count(usage.get("outputTokens")), cached, written))


def error_kind(status: int, error_type: str | None, message: str) -> Kind:
    kind = _KINDS.get((error_type or "").lower())
    if kind is None:
        kind = classify_status(status, None)
    if kind is CLIENT_ERROR and _CONTEXT_WORDING.search(message):
        return CONTEXT_LENGTH
    return kind


def error_type(headers: tuple[tuple[bytes, bytes], ...], data: Any) -> str | None:
    """The exception's name: from `x-amzn-errortype` or the body's `__type`."""
    for name, value in headers:
        if name.lower() == b"x-amzn-errortype":
            return value.decode("latin-1").split(":", 1)[0]
    kind = data.get("__type") if isinstance(data, dict) else None
    return kind.rsplit("#", 1)[-1] if isinstance(kind, str) else None


def parse_error(
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    retry_after: float | None = None,
) -> Failure:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    message = data.get("message") or data.get("Message") if isinstance(data, dict) else None
    text = str(message or f"Bedrock answered {status}")[:500]
    kind = error_kind(status, error_type(headers, data), text)
    return cs.failure(kind, text, status, retry_after)


def _stream_failure(frame: Frame) -> Failure:
    name = frame.header(":exception-type") or frame.header(":error-code")
    try:
        data = orjson.loads(frame.payload) if frame.payload else {}
    except orjson.JSONDecodeError:
        data = {}
    message = data.get("message") if isinstance(data, dict) else None
    text = str(message or frame.header(":error-message") or name or "stream error")[:500]
    kind = error_kind(500, name, text)
    return cs.failure(kind, f"Bedrock stream: {name}: {text}")

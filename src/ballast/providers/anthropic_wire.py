"""Anthropic Messages answers as chat completions: a whole message, the streaming event
machine (message_start, content blocks, message_delta, message_stop, ping, error) as chat
chunks, and its errors as the one taxonomy.

Thinking is `reasoning_content`, and the blocks Anthropic signed come along as
`thinking_blocks` (what a client sends back on its next turn, anthropic_request.py): a whole
answer's message lists them in order, `{"type": "thinking", "thinking", "signature"}` or
`{"type": "redacted_thinking", "data"}`; in a stream, a thinking block's text comes as
`reasoning_content` deltas and its `signature_delta` as a delta
`{"thinking_blocks": [{"type": "thinking", "thinking": "", "signature": ...}]}` that closes
it, and a redacted block whole, as a delta of its own."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.providers.chat_shapes import openai_error
from ballast.resilience import failures
from ballast.resilience.failures import Failure, Kind
from ballast.stream.usage import chat_usage, read
from ballast.upstream.provider_wire import Decoder, Wire
from ballast.upstream.sse import DONE, MAX_EVENT_BYTES, SseSplitter, event_data

FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_ERROR_KINDS: dict[str, Kind] = {
    "rate_limit_error": failures.RATE_LIMITED,
    "overloaded_error": failures.OVERLOADED,
    "api_error": failures.SERVER_ERROR,
    "timeout_error": failures.REQUEST_TIMEOUT,
    "authentication_error": failures.UPSTREAM_AUTH,
    "permission_error": failures.UPSTREAM_AUTH,
    "request_too_large": failures.CONTEXT_LENGTH,
}
_CONTEXT_HINTS = ("prompt is too long", "context window", "context length", "too many tokens")
_PING = b": ping"  # a comment: not relayed, but it restarts the inter-chunk clock
_TEXT = b'[{"index":0,"delta":{"content":'
_TEXT_END = b'},"finish_reason":null}]}'


_QUIET = (b"event: ping\n", b"event: content_block_stop\n")


def _data(event: bytes) -> bytes | None:
    """An event's data: at once for the usual `event: NAME` line and one data line,
    else read line by line."""
    at = event.find(b"\ndata:")
    if at != -1 and event.find(b"\n", at + 1) == -1 and event.startswith(b"event:"):
        return event[at + 6 :]
    return event_data(event)


def usage_of(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage as OpenAI's: the cache's reads and writes are prompt tokens too, and
    are named apart (writes for an hour too), as are the thinking tokens of the output."""
    return chat_usage(read(usage))


def _error_of(payload: Any) -> tuple[str, str]:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return "api_error", "upstream error"
    return str(error.get("type") or "api_error"), str(error.get("message") or "")


def kind_of(status: int | None, error_type: str, message: str) -> Kind:
    """The taxonomy's kind for an Anthropic error (by status when it has one)."""
    if status == 529:
        return failures.OVERLOADED
    if error_type == "invalid_request_error" or status in (400, 413):
        lowered = message.lower()
        if status == 413 or any(hint in lowered for hint in _CONTEXT_HINTS):
            return failures.CONTEXT_LENGTH
        return failures.CLIENT_ERROR
    kind = _ERROR_KINDS.get(error_type)
    if kind is not None:
        return kind
    if status is None:
        return failures.SERVER_ERROR
    return failures.classify_status(status, None)


class AnthropicErrors(Wire):
    """A wire to Anthropic: its errors are read as any Anthropic error is (failure_of)."""

    __slots__ = ()

    def failure(
        self,
        status: int,
        body: bytes,
        headers: tuple[tuple[bytes, bytes], ...],
        retry_after: float | None,
        deployment: str,
    ) -> Failure:
        return failure_of(status, body, headers, retry_after, deployment)


class AnthropicWire(AnthropicErrors):
    """One call to `/v1/messages`."""

    __slots__ = ("created", "model", "trim", "usage_wanted")

    def __init__(
        self,
        target: str,
        headers: bytes,
        model: str,
        created: int,
        usage_wanted: bool,
        trim: bool = False,
    ) -> None:
        super().__init__(target, headers)
        self.model = model  # the deployment's name for it, until the answer names its own
        self.created = created
        self.usage_wanted = usage_wanted
        # The prefill went out without its trailing whitespace (Messages refuses it), which
        # the client already has: the answer's own leading whitespace is dropped.
        self.trim = trim

    def answer(self, data: bytes) -> tuple[bytes, dict[str, Any]]:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ValueError("not JSON") from None
        if not isinstance(message, dict) or message.get("type") != "message":
            raise ValueError("not a message")
        text: list[str] = []
        reasoning: list[str] = []
        thoughts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for block in message.get("content") or ():
            kind = block.get("type")
            if kind == "text":
                text.append(block.get("text") or "")
            elif kind == "thinking":
                reasoning.append(block.get("thinking") or "")
                thoughts.append(_thought(block))
            elif kind == "redacted_thinking":
                thoughts.append({"type": kind, "data": block.get("data") or ""})
            elif kind == "tool_use":
                arguments = orjson.dumps(block.get("input") or {}).decode()
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": arguments},
                    }
                )
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
        if calls:
            reply["tool_calls"] = calls
        if reasoning:
            reply["reasoning_content"] = "".join(reasoning)
        if thoughts:
            reply["thinking_blocks"] = thoughts
        payload = {
            "id": message.get("id") or "",
            "object": "chat.completion",
            "created": self.created,
            "model": message.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "finish_reason": FINISH.get(message.get("stop_reason") or "", "stop"),
                }
            ],
            "usage": usage_of(message.get("usage") or {}),
        }
        return orjson.dumps(payload), payload

    def decoder(self, max_event_bytes: int = MAX_EVENT_BYTES) -> Decoder:
        return MessageStream(
            self.model, self.created, self.usage_wanted, self.trim, max_event_bytes
        )


def _thought(block: dict[str, Any]) -> dict[str, Any]:
    """A thinking block as the chat answer carries it: its text and signature exactly."""
    text, signature = block.get("thinking"), block.get("signature")
    return {
        "type": "thinking",
        "thinking": text if isinstance(text, str) else "",
        "signature": signature if isinstance(signature, str) else "",
    }


class NativeWire(AnthropicErrors):
    """A Messages request passed through as the client sent it: the answer, the stream's
    events and their bytes come back untouched (the base Wire's); only errors are read, to
    be classified as any Anthropic error is."""

    __slots__ = ()


def failure_of(
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    retry_after: float | None,
    deployment: str,
) -> Failure:
    """An Anthropic error answer as a classified Failure (its message kept for the client)."""
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    error_type, message = _error_of(payload)
    kind = kind_of(status, error_type, message)
    return Failure(
        kind,
        f"upstream answered {status} ({error_type})",
        status=status,
        body=openai_error(kind, message or f"upstream answered {status}"),
        headers=headers,
        retry_after=retry_after,
        deployment=deployment,
    )


class MessageStream:
    """The Messages event machine, fed raw bytes, giving chat chunk events. Content block
    indexes become tool-call indexes in the order the tool_use blocks open."""

    __slots__ = (
        "_failure",
        "_head",
        "_model",
        "_sse",
        "_tools",
        "_trim",
        "_usage",
        "_usage_wanted",
        "created",
        "id",
    )

    def __init__(
        self,
        model: str,
        created: int,
        usage_wanted: bool,
        trim: bool = False,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self._trim = trim
        self._failure: Failure | None = None
        self._sse = SseSplitter(max_event_bytes)
        self._model = model
        self.created = created
        self.id = ""
        self._head = self._make_head()
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._usage: dict[str, Any] = {}
        self._usage_wanted = usage_wanted

    def feed(self, data: bytes) -> list[bytes]:
        return self._events(self._sse.feed(data))

    def finish(self) -> list[bytes]:
        return self._events(self._sse.finish())

    def _events(self, events: list[bytes]) -> list[bytes]:
        """Chat events for `events`. An error event after others is raised on the next
        call, so the text before it still reaches the client."""
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
        out: list[bytes] = []
        for event in events:
            try:
                self._event(event, out)
            except Failure as error:
                if not out:
                    raise
                self._failure = error
                break
        return out

    def _event(self, event: bytes, out: list[bytes]) -> None:
        if event.startswith(_QUIET):  # nothing in them to parse
            out.append(_PING)
            return
        data = _data(event)
        if data is None:
            out.append(_PING)
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            out.append(b"data: " + data)  # malformed: the stream state counts it
            return
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "content_block_delta":
            self._delta(payload, out)
        elif kind == "message_start":
            self._start(payload.get("message") or {}, out)
        elif kind == "content_block_start":
            self._block(payload, out)
        elif kind == "message_delta":
            self._message_delta(payload, out)
        elif kind == "message_stop":
            if self._usage_wanted:
                usage = orjson.dumps(usage_of(self._usage))
                out.append(self._head + b'[],"usage":' + usage + b"}")
            out.append(DONE)
        elif kind == "error":
            error_type, message = _error_of(payload)
            kind_ = kind_of(None, error_type, message)
            raise Failure(
                kind_,
                f"upstream sent an error event mid-stream ({error_type})",
                body=openai_error(kind_, message),
            )
        else:  # ping, content_block_stop, and events added later
            out.append(_PING)

    def _start(self, message: dict[str, Any], out: list[bytes]) -> None:
        self.id = message.get("id") or ""
        self._model = message.get("model") or self._model
        self._usage = dict(message.get("usage") or {})
        self._head = self._make_head()
        out.append(self._chunk({"role": "assistant", "content": ""}))

    def _make_head(self) -> bytes:
        """The bytes every chunk starts with; `choices` follows."""
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
        head["model"] = self._model
        return b"data: " + orjson.dumps(head)[:-1] + b',"choices":'

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return self._head + b"[" + orjson.dumps(choice) + b"]}"

    def _block(self, payload: dict[str, Any], out: list[bytes]) -> None:
        block = payload.get("content_block") or {}
        kind = block.get("type")
        if kind == "tool_use":
            index = self._tools[payload.get("index", 0)] = len(self._tools)
            call = {
                "index": index,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name") or "", "arguments": ""},
            }
            out.append(self._chunk({"tool_calls": [call]}))
        elif kind == "text" and block.get("text"):
            out.append(self._chunk({"content": block["text"]}))
        elif kind == "redacted_thinking":  # comes whole: no deltas follow
            redacted = {"type": kind, "data": block.get("data") or ""}
            out.append(self._chunk({"thinking_blocks": [redacted]}))
        else:
            out.append(_PING)

    def _delta(self, payload: dict[str, Any], out: list[bytes]) -> None:
        delta = payload.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            piece = delta.get("text") or ""
            if self._trim:
                piece = piece.lstrip()
                if not piece:
                    out.append(_PING)
                    return
                self._trim = False
            text = orjson.dumps(piece)
            out.append(self._head + _TEXT + text + _TEXT_END)
        elif kind == "input_json_delta":
            index = self._tools.get(payload.get("index", 0), 0)
            call = {"index": index, "function": {"arguments": delta.get("partial_json") or ""}}
            out.append(self._chunk({"tool_calls": [call]}))
        elif kind == "thinking_delta":
            out.append(self._chunk({"reasoning_content": delta.get("thinking") or ""}))
        elif kind == "signature_delta":  # ends its thinking block: the client sends it back
            signed = _thought({"thinking": "", "signature": delta.get("signature")})
            out.append(self._chunk({"thinking_blocks": [signed]}))
        else:  # citations: nothing a chat client reads
            out.append(_PING)

    def _message_delta(self, payload: dict[str, Any], out: list[bytes]) -> None:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._usage.update({k: v for k, v in usage.items() if v is not None})
        reason = (payload.get("delta") or {}).get("stop_reason")
        if reason:
            out.append(self._chunk({}, FINISH.get(reason, "stop")))
        else:
            out.append(_PING)

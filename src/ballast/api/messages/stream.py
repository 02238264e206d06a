"""A chat stream as Anthropic's typed events, one translator per request.

States: WAITING (nothing said yet; keep-alive comments become `ping` events), OPEN
(`message_start` sent; content blocks open and close as the chat deltas change kind: thinking,
text, one tool_use block per tool call; a `thinking_blocks` delta gives the open thinking
block its signature and closes it, or is a redacted block of its own), ENDED
(`message_delta` and `message_stop` sent, or an `error` event). `message_start` is held
until the first chat chunk, so it carries the upstream's answer id and model; its
`input_tokens` is the upstream's count when that chunk reports usage, else the gateway's
estimate, and `message_delta` carries the real input and output tokens of the usage chunk at
the end, the cache's reads and writes and the thinking tokens with them (the SDK keeps the
later figures). Reads each event's parsed data
(`StreamEvent.json`); a stream broken past healing ends with `fail`."""

from __future__ import annotations

import enum
from typing import Any

import orjson

from ballast.api.messages.answer import (
    REASONING_FIELDS,
    message_id,
    stop_reason,
    thinking_blocks,
    usage_of,
)
from ballast.api.messages.errors import event as error_event
from ballast.api.messages.errors import relay_event
from ballast.pipeline.errors import ApiError
from ballast.stream.event import NOT_JSON, StreamEvent, raw

# What ends a native stream the upstream finished (its `message_delta` sent) but left
# without its `message_stop`: the exchange marks that end with a `[DONE]` of its own.
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


class NativeStream:
    """A native Messages stream passes as the upstream sent it (one that finished without
    `message_stop` gets it); only the relay's error for a stream broken past healing becomes
    Anthropic's `error` event: one cut before its `message_delta` never ends cleanly."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = False

    def feed(self, events: list[StreamEvent]) -> bytes:
        if self.ended:
            return b""
        # Anthropic's events are named; only the [DONE] that ends a finished stream is not,
        # and it is the last event the stream gives.
        last = events[-1] if events else None
        if last is None or last.name is not None or not last.done:
            return raw(events)
        return raw(events[:-1]) + _MESSAGE_STOP

    def finish(self) -> bytes:
        return b""

    def fail(self, error: ApiError) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        return relay_event(error)


def _anthropic(events: list[StreamEvent]) -> bool:
    """Whether these are Anthropic's events: those are all named and chat's never are, so
    the first with data says (a keep-alive comment may come before it)."""
    for event in events:
        if event.data is not None:
            return event.name is not None
    return False


class State(enum.Enum):
    WAITING = "waiting"
    OPEN = "open"
    ENDED = "ended"


_WAITING, _ENDED = State.WAITING, State.ENDED
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_TEXT_START = (
    b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_TEXT = ("text", -1)
# A text delta, the event nearly every chunk becomes: formatted, not built and encoded.
_TEXT_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
    b'"delta":{"type":"text_delta","text":%b}}\n\n'
)


def sse(name: bytes, payload: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class MessagesStream:
    """Feeds on typed chat events; returns Anthropic SSE bytes."""

    __slots__ = (
        "_block",
        "_blocks",
        "_finish",
        "_matched",
        "_native",
        "_out",
        "_tools",
        "_usage",
        "estimate",
        "model",
        "state",
        "stops",
    )

    def __init__(self, model: str, stops: Any, estimate: int) -> None:
        self.model = model
        self.stops = stops
        self.estimate = estimate  # input tokens for message_start when the upstream says none
        self.state = State.WAITING
        self._out: list[bytes] = []
        self._blocks = 0  # content blocks started so far
        self._block: tuple[str, int] | None = None  # the open block: (kind, tool index or -1)
        self._tools: dict[int, int] = {}  # chat tool call index -> content block index
        self._finish: Any = None
        self._matched: Any = None
        self._usage: Any = None
        # Set when the stream came from a native deployment of a mixed group: its events are
        # Anthropic's already (named; chat events never are) and pass as they are.
        self._native: NativeStream | None = None

    @property
    def ended(self) -> bool:
        return self.state is State.ENDED

    def __repr__(self) -> str:
        return f"<MessagesStream {self.state.value} blocks={self._blocks}>"

    def feed(self, events: list[StreamEvent]) -> bytes:
        native = self._native
        if native is not None:
            return native.feed(events)
        state = self.state
        if state is _ENDED:
            return b""
        if state is _WAITING and _anthropic(events):
            self._native = native = NativeStream()
            self.state = State.OPEN
            return native.feed(events)
        out = self._out
        for event in events:
            self._event(event)
            if self.state is _ENDED:
                break
        self._out = []
        return b"".join(out)

    def finish(self) -> bytes:
        """The chat stream ended: a finished answer is closed; one that never finished and
        had no error event is ended with one (never a truncated success)."""
        if self._native is not None or self.state is State.ENDED:
            return b""
        if self._finish is None:
            self._fail("api_error", "The upstream stream ended before the answer finished.")
        else:
            self._end()
        out, self._out = self._out, []
        return b"".join(out)

    def fail(self, error: ApiError) -> bytes:
        """The stream broke past healing: it ends with Anthropic's `error` event."""
        if self._native is not None:
            return self._native.fail(error)
        if self.state is State.ENDED:
            return b""
        self.state = State.ENDED
        out, self._out = self._out, []
        out.append(relay_event(error))
        return b"".join(out)

    # -- one chat event ----------------------------------------------------------------

    def _event(self, event: StreamEvent) -> None:
        chunk = event.json
        if chunk is NOT_JSON:
            if event.data is None:
                if event.raw.startswith(b":") and self.state is State.WAITING:
                    self._out.append(PING)  # the keep-alive while the first token is awaited
            elif event.done:
                if self._finish is None:
                    self._fail("api_error", "The upstream stream ended before the answer finished.")
                else:
                    self._end()
            return  # the relay skips malformed chunks too
        if type(chunk) is not dict:
            return
        if self.state is _WAITING:
            self._start(chunk)
        usage = chunk.get("usage")
        if usage is not None and type(usage) is dict:
            self._usage = usage
        choices = chunk.get("choices")
        if choices and type(choices) is list:
            choice = choices[0]
            if type(choice) is dict:
                delta = choice.get("delta")
                # The common chunk: one piece of text, nothing else (written for speed).
                if type(delta) is dict and len(delta) == 1 and self._block is _TEXT:
                    piece = delta.get("content")
                    if type(piece) is str and not choice.get("finish_reason"):
                        if piece:
                            self._out.append(_TEXT_DELTA % (self._blocks - 1, orjson.dumps(piece)))
                        return
                self._choice(choice)

    def _start(self, chunk: dict[str, Any]) -> None:
        model = chunk.get("model")
        usage = usage_of(chunk.get("usage"), self.estimate)
        usage["output_tokens"] = 0
        usage.pop("output_tokens_details", None)
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) and model else self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        self._out.append(sse(b"message_start", {"type": "message_start", "message": message}))
        self.state = State.OPEN

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for name in REASONING_FIELDS:
                piece = delta.get(name)
                if isinstance(piece, str) and piece:
                    self._delta("thinking", -1, {"type": "thinking_delta", "thinking": piece})
            signed = delta.get("thinking_blocks")
            if signed is not None:
                self._signed(thinking_blocks(signed))
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self._delta("text", -1, {"type": "text_delta", "text": piece})
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        self._tool(call)
        finish = choice.get("finish_reason")
        if finish:
            self._finish = finish
            self._matched = choice.get("stop_reason")

    def _tool(self, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        if type(index) is not int:
            return
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if index not in self._tools:
            call_id = call.get("id")
            block = {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{index}",
                "name": str(function.get("name") or ""),
                "input": {},
            }
            self._open("tool", index, block)
            self._tools[index] = self._blocks - 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._out.append(
                sse(
                    b"content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._tools[index],
                        "delta": {"type": "input_json_delta", "partial_json": arguments},
                    },
                )
            )

    def _signed(self, blocks: list[dict[str, Any]]) -> None:
        """Thinking blocks as Anthropic signed them: a thinking block's signature ends the
        block its text opened (with any text not yet sent); a redacted one comes whole."""
        for block in blocks:
            if block["type"] == "redacted_thinking":
                self._open("redacted", -1, block)
            else:
                text = block["thinking"]
                if text:
                    self._delta("thinking", -1, {"type": "thinking_delta", "thinking": text})
                elif self._block != ("thinking", -1):
                    self._open("thinking", -1, {**block, "signature": ""})
                signature = {"type": "signature_delta", "signature": block["signature"]}
                self._delta("thinking", -1, signature)
            self._close()

    # -- blocks ------------------------------------------------------------------------

    def _delta(self, kind: str, tool: int, delta: dict[str, Any]) -> None:
        if self._block != (kind, tool):
            if kind == "text":  # the very tuple the common chunk is told by
                self._begin(_TEXT, _TEXT_START % self._blocks)
            else:
                self._open(kind, tool, {"type": "thinking", "thinking": "", "signature": ""})
        index = self._blocks - 1
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        self._out.append(sse(b"content_block_delta", payload))

    def _open(self, kind: str, tool: int, block: dict[str, Any]) -> None:
        payload = {"type": "content_block_start", "index": self._blocks, "content_block": block}
        self._begin((kind, tool), sse(b"content_block_start", payload))

    def _begin(self, block: tuple[str, int], start: bytes) -> None:
        """The open block closed, and a new one started with its `start` event."""
        self._close()
        self._out.append(start)
        self._block = block
        self._blocks += 1

    def _close(self) -> None:
        if self._block is not None:
            self._out.append(_BLOCK_STOP % (self._blocks - 1))
            self._block = None

    def _end(self) -> None:
        if self.state is State.WAITING:
            self._start({})
        self._close()
        reason, sequence = stop_reason(self._finish, self._matched, self.stops)
        usage = usage_of(self._usage, self.estimate)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        payload = {"type": "message_delta", "delta": delta, "usage": usage}
        self._out.append(sse(b"message_delta", payload))
        self._out.append(_MESSAGE_STOP)
        self.state = State.ENDED

    def _fail(self, error_type: str, message: str) -> None:
        self._out.append(error_event(error_type, message))
        self.state = State.ENDED

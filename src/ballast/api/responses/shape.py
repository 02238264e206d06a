"""`POST /v1/responses` as an inbound shape. Each request is served one of two ways, chosen
from the deployments that may answer it (`responses: native|bridge` on each):

- bridge: the request becomes a chat completion (request.py), and the chat answer or stream
  becomes a Response or its events (answer.py, stream.py): any upstream can serve it;
- native: every deployment of the model (and of its fallbacks) speaks Responses itself, so
  the client's body goes to their `/responses` and their answer comes back as it is. Routing,
  failover before the first byte, the stream clocks, keys and spend work as for any request;
  a native stream that breaks after its first byte is not continued (its events cannot be
  spliced): the client gets an `error` event and `response.failed`.

The pipeline, the attempt loop and the relay never know which way a request went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ballast.api.responses.answer import new_id, to_response
from ballast.api.responses.request import to_chat
from ballast.api.responses.stream import ResponseStream
from ballast.config import ModelGroup
from ballast.pipeline.context import RequestContext
from ballast.pipeline.duplicate_keys import DuplicateKeys
from ballast.pipeline.errors import ApiError, bad_request
from ballast.pipeline.shape import Modes, Resolve, Shape, StreamTranslator
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.stream.event import StreamEvent, raw

_MAX_OUTPUT = 1 << 24
# The fields read from the body (a native request forwards the client's bytes as they are).
_NATIVE = frozenset(("native",))
_DUPLICATES = DuplicateKeys(
    ("model", "stream", "max_output_tokens", "fallbacks", "cache", "background")
)


@dataclass(slots=True)
class ResponsesContext(RequestContext):
    """A Responses request: the pipeline's (chat or native) request, with the client's own
    body and the id its answer will carry."""

    request: dict[str, Any] = field(default_factory=dict)
    response_id: str = ""
    created: int = 0


def _typed_error(code: str | None, message: str, sequence: int) -> bytes:
    body: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": None}
    body["sequence_number"] = sequence
    return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"


_LIFECYCLE = frozenset(("response.created", "response.in_progress"))


class NativeStream:
    """A native stream passes as the upstream sent it. The relay's error for a stream broken
    past healing (a native stream is never continued) ends it as a Responses stream that
    failed does: an `error` event, then `response.failed` carrying the upstream's own
    response (its id, so a client's snapshot of it holds) with the items it finished,
    numbered after the last event relayed; never a `response.completed`. All read off the
    events' parsed data, which the stream's state already parsed."""

    __slots__ = ("_items", "_last", "_response")

    def __init__(self) -> None:
        self._last = -1
        self._response: dict[str, Any] | None = None  # as response.created/in_progress gave it
        self._items: dict[int, Any] = {}  # the output items done so far, by output index

    def feed(self, events: list[StreamEvent]) -> bytes:
        for event in events:
            payload = event.json
            if type(payload) is not dict:
                continue
            number = payload.get("sequence_number")
            if type(number) is int:
                self._last = number
            kind = payload.get("type")
            if kind == "response.output_item.done":
                index = payload.get("output_index")
                if type(index) is int:
                    self._items[index] = payload.get("item")
            elif kind in _LIFECYCLE:
                response = payload.get("response")
                if type(response) is dict:
                    self._response = response
        return raw(events)

    def finish(self) -> bytes:
        return b""

    def fail(self, error: ApiError) -> bytes:
        message = error.message or "the upstream stream failed"
        number = self._last + 1
        out = _typed_error(error.code, message, number)
        if self._response is None:
            return out
        failed = {
            **self._response,
            "status": "failed",
            "error": {"code": "server_error", "message": message},
            "output": [self._items[i] for i in sorted(self._items)],
        }
        event = {"type": "response.failed", "sequence_number": number + 1, "response": failed}
        return out + b"event: response.failed\ndata: " + orjson.dumps(event) + b"\n\n"


class ResponsesShape(Shape):
    name = "responses"
    translates = True

    def __init__(self, resolve: Resolve, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._modes = Modes(resolve, lambda d: d.responses_mode)

    def parse(self, path: str, body: bytes) -> RequestContext:
        payload = _DUPLICATES.load(body)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise bad_request("You must provide a model parameter.", "model")
        stream = payload.get("stream") or False
        if not isinstance(stream, bool):
            raise bad_request("'stream' must be a boolean.", "stream")
        cap = payload.get("max_output_tokens")
        if cap is not None and (type(cap) is not int or cap < 1 or cap > _MAX_OUTPUT):
            raise bad_request(
                f"'max_output_tokens' must be an integer from 1 to {_MAX_OUTPUT}.",
                "max_output_tokens",
            )
        ctx = ResponsesContext("/responses", payload, body, model, stream)
        ctx.fallbacks = _fallbacks(payload)
        ctx.request = payload
        ctx.response_id = new_id("resp")
        ctx.created = int(self._clock.time())
        return ctx

    def bind(self, ctx: RequestContext, group: ModelGroup) -> None:
        """Native or bridged, now that the model group is known (and the key checked)."""
        assert isinstance(ctx, ResponsesContext)
        payload = ctx.request
        if self._modes.of(group, ctx.fallbacks) == _NATIVE:
            ctx.native = True
            ctx.usage_added = True  # a Responses stream always ends with its usage
            if "fallbacks" in payload:
                ctx.edits["fallbacks"] = None  # Ballast's own field: never forwarded
            return
        dropped: list[str] = []
        chat = to_chat(payload, dropped)
        ctx.dropped = tuple(dropped)
        if "cache" in payload:
            chat["cache"] = payload["cache"]  # Ballast's own field, read by the cache
        ctx.path = "/chat/completions"
        ctx.payload = chat
        ctx.raw = orjson.dumps(chat)

    def answer(self, ctx: RequestContext, payload: dict[str, Any]) -> bytes | None:
        assert isinstance(ctx, ResponsesContext)
        if ctx.native:
            return None
        return orjson.dumps(to_response(payload, ctx.request, ctx.response_id, ctx.created))

    def translator(self, ctx: RequestContext) -> StreamTranslator:
        assert isinstance(ctx, ResponsesContext)
        if ctx.native:
            return NativeStream()
        return ResponseStream(ctx.request, ctx.response_id, ctx.created, "")

    def error_event(self, error: ApiError) -> bytes:
        """A stream that failed before any event of its own went out (keep-alive comments
        at most): the error is its first numbered event."""
        return _typed_error(error.code, error.message, 0)


def _fallbacks(payload: dict[str, Any]) -> tuple[str, ...]:
    given = payload.get("fallbacks")
    if given is None:
        return ()
    if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
        raise bad_request("'fallbacks' must be a list of model names.", "fallbacks")
    return tuple(given)

"""Chat completion chunks as Responses streaming events: an explicit state machine over the
output items (reasoning, one message, function calls), each event numbered. Fed the relay's
typed chat events (their parsed data); what it returns is whole Responses SSE events for the
client."""

from __future__ import annotations

import enum
from typing import Any

import orjson

from ballast.api.responses import answer
from ballast.api.responses.answer import call_item, message_item, new_id, reasoning_item, text_part
from ballast.pipeline.errors import ApiError
from ballast.stream.event import NOT_JSON, StreamEvent

_REASONING = ("reasoning_content", "reasoning")
# A streamed part's kind -> (its delta event, its done event, the done event's text field).
_PARTS = {
    "message": ("response.output_text.delta", "response.output_text.done", "text"),
    "refusal": ("response.refusal.delta", "response.refusal.done", "refusal"),
    "reasoning": ("response.reasoning_text.delta", "response.reasoning_text.done", "text"),
}


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return text_part(text)
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "reasoning_text", "text": text}


def _text_item(kind: str, item_id: str, text: str, status: str) -> dict[str, Any]:
    """A message (of text or a refusal) or a reasoning item, as added or as done."""
    if kind == "reasoning":
        return reasoning_item(item_id, text, status)
    item = message_item(item_id, "", status)
    if status != "in_progress":
        item["content"] = [_part(kind, text)]
    return item


class Phase(enum.Enum):
    NEW = "new"  # nothing sent yet
    OPEN = "open"  # response.created sent; items come and go
    ENDED = "ended"  # a terminal event (completed, incomplete, failed) sent


class _Item:
    """One output item being streamed: its index, id, kind and what it has said."""

    __slots__ = ("call_id", "delta_head", "index", "item_id", "kind", "name", "parts")

    def __init__(self, index: int, item_id: str, kind: str) -> None:
        self.index = index
        self.item_id = item_id
        self.kind = kind  # "message", "refusal", "reasoning" or "function_call"
        self.parts: list[str] = []
        self.call_id = ""
        self.name = ""
        self.delta_head = b""  # the start of each of its delta events, made once

    @property
    def text(self) -> str:
        return "".join(self.parts)


_NEW, _OPEN, _ENDED = Phase.NEW, Phase.OPEN, Phase.ENDED


class ResponseStream:
    """One request's translator. `start` opens the response, `feed` takes relayed chat
    events, `fail` ends it with the failure in Responses' shape (an `error` event, then
    `response.failed` when the response had opened). States: NEW -> OPEN -> ENDED."""

    def __init__(self, request: dict[str, Any], response_id: str, created: int, model: str):
        self.response = answer.shell(request, response_id, created, model)
        self.phase = Phase.NEW
        self._sequence = 0
        self._out: list[bytes] = []
        self._items: list[_Item] = []
        self._text: _Item | None = None  # the open message, refusal or reasoning item
        self._calls: dict[int, _Item] = {}  # chat tool-call index -> its open item
        self._finish: Any = None
        self._usage: Any = None

    def __repr__(self) -> str:
        return f"<ResponseStream {self.response['id']} {self.phase.value} items={len(self._items)}>"

    # -- the client's side -----------------------------------------------------------

    def _emit(self, kind: str, body: dict[str, Any]) -> None:
        body["type"] = kind
        body["sequence_number"] = self._sequence
        self._sequence += 1
        self._out.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n")

    def _emit_response(self, *kinds: bytes) -> None:
        """Events that carry the whole response (its opening two, its end): the response
        encoded once for them all, each written as `_emit` writes it."""
        encoded = orjson.dumps(self.response)
        for kind in kinds:
            self._out.append(
                b'event: %b\ndata: {"response":%b,"type":"%b","sequence_number":%d}\n\n'
                % (kind, encoded, kind, self._sequence)
            )
            self._sequence += 1

    def _take(self) -> bytes:
        out, self._out = b"".join(self._out), []
        return out

    def start(self) -> bytes:
        """The response's opening events (once)."""
        self._open_response()
        return self._take()

    def _open_response(self) -> None:
        if self.phase is Phase.NEW:
            self.phase = Phase.OPEN
            self._emit_response(b"response.created", b"response.in_progress")

    def feed(self, events: list[StreamEvent]) -> bytes:
        """Typed chat events (as the relay yields them) -> whole Responses events. Comments
        (keep-alives) pass as they are; the response opens with the first data."""
        if self.phase is _ENDED:
            return b""
        for event in events:
            payload = event.json
            if type(payload) is dict and self.phase is _OPEN:  # all but the first chunk
                self._chunk(payload)
                continue
            if payload is NOT_JSON:
                if event.data is None:
                    if event.raw.startswith(b":"):
                        self._out.append(event.raw)
                    continue
                if not event.done:
                    continue  # the relay passes only parsed events; nothing to say about others
                self._open_response()
                self._complete()
                break
            if not isinstance(payload, dict):
                continue
            model = payload.get("model")
            if self.phase is Phase.NEW and isinstance(model, str) and model:
                self.response["model"] = model  # the model that answers, from the start
            self._open_response()
            self._chunk(payload)
        return self._take()

    def finish(self) -> bytes:
        """The chat stream ended: a response still open was cut short (the relay always
        ends a whole answer with [DONE] and a broken one with its error event)."""
        if self.phase is Phase.OPEN:
            self._fail_with({"message": "the stream ended before the answer finished"})
        return self._take()

    def fail(self, error: ApiError) -> bytes:
        """The stream broke and nothing can continue it: its end in Responses' shape."""
        self._fail_with({"message": error.message, "code": error.code})
        return self._take()

    # -- the chat side ---------------------------------------------------------------

    def _chunk(self, payload: dict[str, Any]) -> None:
        if not self.response["model"]:
            model = payload.get("model")
            if isinstance(model, str) and model:
                self.response["model"] = model
        usage = payload.get("usage")
        if usage is not None:
            self._usage = usage
        choices = payload.get("choices")
        if not choices or type(choices) is not list:
            return
        choice = choices[0]
        if type(choice) is not dict:
            return
        delta = choice.get("delta")
        if type(delta) is dict and len(delta) == 1 and "content" in delta:  # the usual chunk
            piece = delta["content"]
            if type(piece) is str and piece:
                self._say("message", piece)
        elif isinstance(delta, dict):
            for name in _REASONING:
                piece = delta.get(name)
                if isinstance(piece, str) and piece:
                    self._say("reasoning", piece)
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self._say("message", piece)
            piece = delta.get("refusal")
            if isinstance(piece, str) and piece:
                self._say("refusal", piece)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._call(call)
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]

    def _open(self, kind: str, item: dict[str, Any]) -> _Item:
        opened = _Item(len(self._items), item["id"], kind)
        self._items.append(opened)
        self._emit("response.output_item.added", {"output_index": opened.index, "item": item})
        return opened

    def _say(self, kind: str, piece: str) -> None:
        current = self._text
        if current is None or current.kind != kind:
            if current is not None:
                self._close(current)
            current = self._text = self._open_text(kind)
        current.parts.append(piece)
        # The most frequent event by far, written without building its object each time.
        self._out.append(
            current.delta_head
            + orjson.dumps(piece)
            + b',"sequence_number":'
            + str(self._sequence).encode()
            + b"}\n\n"
        )
        self._sequence += 1

    def _open_text(self, kind: str) -> _Item:
        item_id = new_id("rs" if kind == "reasoning" else "msg")
        opened = self._open(kind, _text_item(kind, item_id, "", "in_progress"))
        where = {"item_id": item_id, "output_index": opened.index, "content_index": 0}
        self._emit("response.content_part.added", {**where, "part": _part(kind, "")})
        event = _PARTS[kind][0]
        fields = {"type": event, **where, **({"logprobs": []} if kind == "message" else {})}
        opened.delta_head = (
            b"event: " + event.encode() + b"\ndata: " + orjson.dumps(fields)[:-1] + b',"delta":'
        )
        return opened

    def _call(self, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        item = self._calls.get(index) if type(index) is int else None
        if item is None:
            if self._text is not None:
                self._close(self._text)
                self._text = None
            given_id, given_name = call.get("id"), function.get("name")
            call_id = given_id if isinstance(given_id, str) else new_id("call")
            name = given_name if isinstance(given_name, str) else ""
            item = self._open(
                "function_call", call_item(new_id("fc"), call_id, name, "", "in_progress")
            )
            item.call_id, item.name = call_id, name
            self._calls[index if type(index) is int else len(self._calls)] = item
        elif isinstance(function.get("name"), str):
            item.name += function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.parts.append(arguments)
            self._emit(
                "response.function_call_arguments.delta",
                {"item_id": item.item_id, "output_index": item.index, "delta": arguments},
            )

    # -- endings ---------------------------------------------------------------------

    def _close(self, item: _Item, status: str = "completed") -> dict[str, Any]:
        where = {"item_id": item.item_id, "output_index": item.index}
        text = item.text
        if item.kind == "function_call":
            done = call_item(item.item_id, item.call_id, item.name, text, status)
            self._emit(
                "response.function_call_arguments.done",
                {**where, "name": item.name, "arguments": text},
            )
        else:
            done = _text_item(item.kind, item.item_id, text, status)
            _, finished, field = _PARTS[item.kind]
            extra: dict[str, Any] = {"logprobs": []} if item.kind == "message" else {}
            self._emit(finished, {**where, "content_index": 0, field: text, **extra})
            part = _part(item.kind, text)
            self._emit("response.content_part.done", {**where, "content_index": 0, "part": part})
        self._emit("response.output_item.done", {"output_index": item.index, "item": done})
        self.response["output"].append(done)
        return done

    def _close_all(self, status: str) -> None:
        open_items = [self._text] if self._text is not None else []
        open_items.extend(self._calls.values())
        if len(open_items) > 1:
            open_items.sort(key=lambda i: i.index)
        for item in open_items:
            self._close(item, status)
        output = self.response["output"]
        if len(output) > 1:
            output.sort(key=lambda it: self._order(it["id"]))
        self._text = None
        self._calls = {}

    def _order(self, item_id: str) -> int:
        return next(i.index for i in self._items if i.item_id == item_id)

    def _complete(self) -> None:
        status = "incomplete" if self._finish == "length" else "completed"
        self._close_all(status)
        answer.finish(self.response, self._finish, self._usage)
        self.phase = Phase.ENDED
        done = self.response["status"] == "completed"
        self._emit_response(b"response.completed" if done else b"response.incomplete")

    def _fail_with(self, error: Any) -> None:
        if self.phase is Phase.ENDED:
            return
        error = error if isinstance(error, dict) else {}
        message = str(error.get("message") or "the upstream stream failed")
        code = str(error.get("code") or "server_error")
        was = self.phase
        self.phase = Phase.ENDED
        # The typed error event first (what Ballast's metrics count as a broken stream),
        # then, for an opened response, its terminal event.
        self._emit("error", {"code": code, "message": message, "param": None})
        if was is Phase.NEW:
            return
        self._close_all("incomplete")
        self.response["status"] = "failed"
        # A failed response's code is one of OpenAI's few; the message says what happened.
        kind = "rate_limit_exceeded" if code == "rate_limit_exceeded" else "server_error"
        self.response["error"] = {"code": kind, "message": message}
        self.response["usage"] = answer.usage_of(self._usage)
        self._emit_response(b"response.failed")

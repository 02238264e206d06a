"""The inbound-shape seam: a translating shape's stream and errors reach the client in its
own form, and the OpenAI shape's pass as they are."""

from __future__ import annotations

from typing import Any

from ballast.pipeline.errors import ApiError
from ballast.pipeline.respond import Responder
from ballast.pipeline.shape import Rendering, TranslatedSend
from ballast.types import Message


class Upper:
    """A translator that upper-cases events and ends with a marker."""

    def __init__(self) -> None:
        self.fed: list[bytes] = []

    def feed(self, data: bytes) -> bytes:
        self.fed.append(data)
        return data.upper() if data.startswith(b"data:") else b""

    def finish(self) -> bytes:
        return b"END\n\n"


class Loud(Rendering):
    name = "loud"
    translates = True

    def error(self, error: ApiError) -> tuple[int, bytes]:
        return 599, error.message.upper().encode()

    def error_event(self, error: ApiError) -> bytes:
        return b"event: error\ndata: " + error.message.encode() + b"\n\n"


class Sink:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def bodies(self) -> list[tuple[bytes, Any]]:
        return [
            (m["body"], m.get("more_body"))
            for m in self.messages
            if m["type"] == "http.response.body"
        ]


async def test_translated_send_translates_bodies_and_flushes_at_the_end() -> None:
    sink = Sink()
    upper = Upper()
    send = TranslatedSend(sink, upper).send
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: b\n\n", "more_body": False})
    assert sink.messages[0]["type"] == "http.response.start"
    # The comment had no counterpart: nothing was sent for it.
    assert sink.bodies() == [(b"DATA: A\n\n", True), (b"DATA: B\n\nEND\n\n", False)]
    assert upper.fed[1] == b": keep-alive\n\n"


async def test_the_last_empty_body_still_carries_the_flush() -> None:
    sink = Sink()
    send = TranslatedSend(sink, Upper()).send
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    assert sink.bodies() == [(b"END\n\n", False)]


async def test_errors_take_the_shape_of_the_responder() -> None:
    error = ApiError(400, "bad field", param="x")
    sink = Sink()
    await Responder(sink, b"r-1", Loud()).error(error)
    assert sink.messages[0]["status"] == 599
    assert sink.bodies()[0][0] == b"BAD FIELD"
    streaming = Responder(Sink(), b"r-1", Loud())
    streaming.started = streaming.streaming = True
    sink = Sink()
    streaming._send = sink
    await streaming.error(error)
    assert sink.bodies() == [(b"event: error\ndata: bad field\n\n", False)]


async def test_the_openai_shape_renders_openai_errors() -> None:
    sink = Sink()
    await Responder(sink, b"r-1").error(ApiError(404, "no such model", code="model_not_found"))
    assert sink.messages[0]["status"] == 404
    assert b'"code":"model_not_found"' in sink.bodies()[0][0]

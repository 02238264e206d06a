"""The inbound-shape seam: a translating shape's stream and errors reach the client in its
own form, and the OpenAI shape's pass as they are."""

from __future__ import annotations

from typing import Any

from ballast.pipeline.errors import ApiError
from ballast.pipeline.respond import Responder
from ballast.pipeline.shape import Rendering
from ballast.stream.event import StreamEvent, read
from ballast.types import Message


class Upper:
    """A translator that upper-cases data events and ends with a marker."""

    def __init__(self) -> None:
        self.fed: list[StreamEvent] = []

    def feed(self, events: list[StreamEvent]) -> bytes:
        self.fed.extend(events)
        return b"".join(e.raw.upper() for e in events if e.data is not None)

    def finish(self) -> bytes:
        return b"END\n\n"

    def fail(self, error: ApiError) -> bytes:
        return b"FAILED: " + error.message.encode() + b"\n\n"


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


def streaming(
    sink: Sink,
    shape: Rendering,
    translator: Upper | None = None,
    strip_usage: bool = False,
) -> Responder:
    """A responder about to send a stream to `sink`."""
    responder = Responder(sink, b"r-1", shape)
    responder.begin_stream(translator, None, strip_usage)
    return responder


async def test_a_translated_stream_is_sent_in_the_shape_and_flushed_at_the_end() -> None:
    sink = Sink()
    upper = Upper()
    out = streaming(sink, Loud(), upper)
    await out.send_raw(out.start_stream([], "a"))
    await out.events([read(b"data: a")], True)
    await out.send_raw(
        {"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True}
    )
    await out.events([read(b"data: b")], False)
    assert sink.messages[0]["type"] == "http.response.start"
    # The comment had no counterpart: nothing was sent for it.
    assert sink.bodies() == [(b"DATA: A\n\n", True), (b"DATA: B\n\nEND\n\n", False)]
    assert upper.fed[1].raw == b": keep-alive\n\n"


async def test_the_last_empty_piece_still_carries_the_flush() -> None:
    sink = Sink()
    await streaming(sink, Loud(), Upper()).events([], False)
    assert sink.bodies() == [(b"END\n\n", False)]


async def test_usage_the_client_did_not_ask_for_is_left_out() -> None:
    sink = Sink()
    usage = read(b'data: {"choices":[],"usage":{"total_tokens":3}}')
    text = read(b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}')
    await streaming(sink, Rendering(), strip_usage=True).events([text, usage], False)
    assert sink.bodies() == [(text.raw, False)]


async def test_a_broken_stream_ends_with_the_error_made_once_in_the_clients_shape() -> None:
    error = ApiError(502, "cut short", "api_error", "upstream_stream_cut")
    sink = Sink()
    out = streaming(sink, Rendering())
    await out.fail(error)
    assert sink.bodies() == [(error.event(), False)] and out.stream_error
    sink = Sink()
    await streaming(sink, Loud(), Upper()).fail(error)
    assert sink.bodies() == [(b"FAILED: cut short\n\n", False)]


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

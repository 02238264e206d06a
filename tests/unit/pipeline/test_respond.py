"""The one client writer: a stream's events go out through it, by `send` or on the fast path
from the upstream's callback, and it notes what the request log reads (the first event, an
error at the end)."""

from __future__ import annotations

from ballast.pipeline.respond import Responder
from ballast.pipeline.shape import Rendering
from ballast.stream.event import StreamEvent, read
from tests.unit.pipeline.test_shape import Sink, Upper


class Writer:
    """A server's fast body writer whose client buffer holds `room` writes."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.open = True
        self.body_complete = True
        self.chunks: list[bytes] = []
        self.drained = 0

    def write(self, body: bytes) -> bool:
        self.chunks.append(body)
        return len(self.chunks) < self.room

    async def drain(self) -> None:
        self.drained += 1
        self.room += 10

    def cork(self) -> None:
        self.corked = True

    def uncork(self) -> None:
        self.corked = False

    def on_disconnect(self, callback: object) -> bool:
        return False

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        return False

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        return False


class Clock:
    def __init__(self) -> None:
        self.now = 1.0

    def __call__(self) -> float:
        return self.now


async def test_the_fast_path_writes_the_shapes_bytes_and_pauses_on_a_full_buffer() -> None:
    writer = Writer(room=2)
    responder = Responder(Sink(), b"r-1", Rendering(), writer)
    responder.begin_stream(Upper())
    assert responder.forwards
    assert responder.forward([read(b"data: a")])
    assert not responder.forward([read(b"data: b")])  # the client's buffer is full
    assert writer.chunks == [b"DATA: A\n\n", b"DATA: B\n\n"]
    await responder.drain()
    await responder.drain()  # only a full buffer is waited for
    assert writer.drained == 1
    assert responder.forward([read(b": comment")])  # nothing to write: nothing written
    assert len(writer.chunks) == 2


async def test_a_stream_the_cache_keeps_is_never_forwarded_past_the_recorder() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.events: list[StreamEvent] = []

        async def store(self) -> None:
            """Nothing to keep here."""

    responder = Responder(Sink(), b"r-1", Rendering(), Writer(room=5))
    responder.begin_stream(None, Recorder())
    assert not responder.forwards
    responder.writer = None
    responder.begin_stream(None)
    assert not responder.forwards  # no writer from the server: every piece goes by `send`


async def test_the_first_event_is_noted_when_it_goes_out_and_comments_do_not_count() -> None:
    clock = Clock()
    sink = Sink()
    responder = Responder(sink, b"r-1", Rendering(), now=clock)
    responder.begin_stream(None)
    await responder.send_raw(responder.start_stream([], "a"))
    clock.now = 2.0
    await responder.send_raw(
        {"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True}
    )
    assert responder.first == 0.0
    clock.now = 3.0
    await responder.events([read(b"data: a")], True)
    clock.now = 4.0
    await responder.events([read(b"data: b")], False)
    assert responder.first == 3.0 and responder.deployment == "a"
    assert responder.status == 200 and not responder.stream_error

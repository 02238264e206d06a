"""The client's side of a response: which upstream headers it may see, and the one writer of
what the client is sent (`Responder`): it knows whether the response has started (before: an
error is a status and a body; after: the stream's error event, or nothing more for a whole
answer), and every event of a stream goes out through it, read by the cache's recorder and
reshaped by the shape's translator on the way, parsed by neither."""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, Protocol

from ballast.pipeline.asgi import JSON, header
from ballast.pipeline.errors import ApiError
from ballast.pipeline.shape import Rendering, StreamTranslator
from ballast.resilience.clock import SYSTEM_CLOCK
from ballast.stream.event import StreamEvent, events_of, raw, usage_only
from ballast.types import BodyWriter, Message, Scope, Send


class StreamRecorder(Protocol):
    """What keeps a stream's events on their way out (the response cache's recorder)."""

    events: list[StreamEvent]

    async def store(self) -> None:
        """Keep the whole answer: called before its last bytes go out."""


Headers = list[tuple[bytes, bytes]]

_ID_PREFIX = os.urandom(4).hex()
_ids = itertools.count(1)


def request_id(scope: Scope) -> bytes:
    """The client's own `x-request-id` when it sent a sane one; else one of this process's."""
    given = header(scope, b"x-request-id")
    if given and len(given) <= 128:
        return given
    return f"{_ID_PREFIX}-{next(_ids)}".encode()


class HeaderAllowlist:
    """Upstream answer headers a client may see: the configured names, and prefixes given
    with a trailing `*`. An upstream's request ids and its organisation's quota headers
    (`x-ratelimit-*`) stay with Ballast unless listed. The same for streams and answers."""

    __slots__ = ("_exact", "_prefixes", "_seen")

    def __init__(self, names: Iterable[str]) -> None:
        lowered = [n.strip().lower() for n in names if n.strip()]
        self._exact = frozenset(n.encode() for n in lowered if not n.endswith("*"))
        self._prefixes = tuple(n[:-1].encode() for n in lowered if n.endswith("*"))
        self._seen: dict[bytes, bool] = {}  # upstreams send the same few names over and over

    def allows(self, name: bytes) -> bool:
        known = self._seen.get(name)
        if known is not None:
            return known
        keep = name in self._exact or name.startswith(self._prefixes)
        if len(self._seen) < 1024:
            self._seen[name] = keep
        return keep

    def filter(self, headers: Iterable[tuple[bytes, bytes]]) -> Headers:
        """`headers` have lower-case names (the transport's relayable ones)."""
        seen = self._seen
        out = []
        for item in headers:
            keep = seen.get(item[0])
            if keep is None:
                keep = self.allows(item[0])
            if keep:
                out.append(item)
        return out


_OPENAI = Rendering()
# The event that ends a broken stream: OpenAI's, and the typed one of other shapes.
_ERROR_EVENTS = (b'data: {"error"', b"event: error\n")


class _Nothing:
    """An awaitable that is done at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_NOTHING = _Nothing()


class Responder:
    """The one writer of a client's response. It wraps the server's `send` and holds its
    fast body `writer`; it knows whether the response started (the guard every stage asks
    before it answers); it renders errors in the client's API `shape`; for a stream it owns
    what reads or reshapes the events on their way out (the cache's recorder, usage the
    client did not ask for left out, the shape's translator), so every event goes out
    through here, from `events` or, on the fast path, from the upstream connection's
    callback (`forward`); and it notes what the request log and metrics read when the
    request ends (status, first byte of a stream, whether a stream ended with an error)."""

    __slots__ = (
        "_now",
        "_send",
        "began",
        "blocked",
        "deployment",
        "error_code",
        "extra",
        "first",
        "recorder",
        "request_id",
        "shape",
        "started",
        "status",
        "stream_error",
        "streaming",
        "strip_usage",
        "translator",
        "writer",
    )

    def __init__(
        self,
        send: Send,
        request_id: bytes,
        shape: Rendering = _OPENAI,
        writer: BodyWriter | None = None,
        now: Callable[[], float] = SYSTEM_CLOCK.monotonic,
    ) -> None:
        self._send = send
        self._now = now
        self.began = now()
        self.request_id = request_id.decode("latin-1")
        self.writer = writer  # the server's, for a body forwarded without `send`
        self.extra: Headers = [(b"x-request-id", request_id)]  # on whatever answer goes out
        self.shape = shape
        self.started = False
        self.streaming = False
        self.status = 0
        self.first = 0.0  # when a stream's first event went out
        self.stream_error = False
        self.deployment: str | None = None  # the deployment a stream came from
        self.error_code: str | None = None  # the code of the error Ballast answered with
        self.translator: StreamTranslator | None = None
        self.recorder: StreamRecorder | None = None
        self.strip_usage = False
        self.blocked = False  # the writer's client buffer is full: drain before forwarding

    # -- the server's send -------------------------------------------------------------

    def send(self, message: Message) -> Awaitable[None]:
        """The server's `send`, after a look at the message (no coroutine of its own): for
        what does not go through `events` (a replayed stream, a whole answer)."""
        if message["type"] == "http.response.body":
            if self.streaming:
                body = message.get("body", b"")
                if not self.first and body and not body.startswith(b":"):
                    self.first = self._now()
                elif body.startswith(_ERROR_EVENTS):
                    self.stream_error = True
        else:
            self.started = True
            self.status = status = message["status"]
            writer = self.writer
            if writer is not None and writer.start(status, message.get("headers", [])):
                return _NOTHING  # the head went out at once, past `send`
        return self._send(message)

    async def answer(self, status: int, headers: Headers, body: bytes) -> None:
        headers.extend(self.extra)
        headers.append((b"content-length", str(len(body)).encode()))
        self.started = True
        self.status = status
        send = self._send
        writer = self.writer
        if writer is None:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if writer.answer(status, headers, body):  # head and body at once, past `send`
            return
        writer.cork()  # the head and the body in one write
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        finally:
            writer.uncork()

    async def error(self, error: ApiError) -> None:
        """An error in the client's shape: a status and a body before the response started;
        the event that ends a started stream; nothing for a started answer."""
        self.error_code = error.code
        if not self.started:
            status, body = self.shape.error(error)
            await self.answer(status, [JSON, *error.headers], body)
        elif self.streaming:
            await self.fail(error)

    # -- a stream ------------------------------------------------------------------------

    def begin_stream(
        self,
        translator: StreamTranslator | None,
        recorder: StreamRecorder | None = None,
        strip_usage: bool = False,
    ) -> None:
        """What the stream's events pass through: the cache's `recorder` keeps every event;
        usage asked of the upstream for accounting, not by the client, is left out
        (`strip_usage`); the shape's `translator` turns the rest into its events (None: the
        events' own bytes, OpenAI's shape)."""
        self.translator = translator
        self.recorder = recorder
        self.strip_usage = strip_usage

    def start_stream(self, headers: Headers, deployment: str | None) -> Message:
        """The start of a stream's response, noted as such."""
        headers.extend(self.extra)
        self.streaming = True
        if deployment is not None:
            self.deployment = deployment
        return {"type": "http.response.start", "status": 200, "headers": headers}

    def send_raw(self, message: Message) -> Awaitable[None]:
        """A message of the stream that is not one of its events (its start, a keep-alive
        comment), through the shape's translator when there is one."""
        translator = self.translator
        if message["type"] == "http.response.body" and translator is not None:
            more = message.get("more_body", False)
            body = translator.feed(events_of(message.get("body", b"")))
            if not more:
                body += translator.finish()
            elif not body:
                return _NOTHING
            message = {"type": "http.response.body", "body": body, "more_body": more}
        return self.send(message)

    def encode(self, events: list[StreamEvent]) -> bytes:
        """The client's bytes for these events (recorded first when the cache keeps them)."""
        if self.recorder is not None:
            self.recorder.events.extend(events)
        if self.strip_usage:
            events = [e for e in events if not usage_only(e)]
        translator = self.translator
        if translator is None:
            return raw(events)
        return translator.feed(events) if events else b""

    def events(self, events: list[StreamEvent], more: bool) -> Awaitable[None]:
        """Sends the events; the last piece (`more` False) ends the shape's stream, and the
        recorder keeps the whole answer before those bytes go out. (No coroutine of its own
        but for that last piece: it runs once per piece.)"""
        body = self.encode(events)
        if more:
            if not body:
                return _NOTHING  # nothing to say yet (an event the shape has no counterpart for)
            if not self.first:
                self.first = self._now()
            return self._send({"type": "http.response.body", "body": body, "more_body": True})
        if self.translator is not None:
            body += self.translator.finish()
        if body and not self.first:
            self.first = self._now()
        if self.recorder is not None:
            return self._last(self.recorder, body)
        return self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _last(self, recorder: StreamRecorder, body: bytes) -> None:
        await recorder.store()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def fail(self, error: ApiError) -> None:
        """Ends a started stream with `error`, in the client's shape."""
        translator = self.translator
        body = self.shape.error_event(error) if translator is None else translator.fail(error)
        self.stream_error = True
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    # -- the fast path -------------------------------------------------------------------

    @property
    def forwards(self) -> bool:
        """Whether events may be written from the upstream connection's callback: the server
        gave a writer, its response is an open chunked body, and nothing keeps the events."""
        writer = self.writer
        return writer is not None and self.recorder is None and writer.open

    def forward(self, events: list[StreamEvent]) -> bool:
        """Writes the events without `send`; False to pause the upstream's reads (the
        client's buffer is full: `drain`, then go on)."""
        writer = self.writer
        if writer is None:
            return False
        body = self.encode(events)
        if body and not writer.write(body):
            self.blocked = True
            return False
        return True

    async def drain(self) -> None:
        """Until the client's buffer has room again, when `forward` found it full."""
        if self.blocked and self.writer is not None:
            self.blocked = False
            await self.writer.drain()

"""The client's side of a response: which upstream headers it may see, and the one place that
knows whether the response has started (before: an error is a status and a body; after: an
SSE error event, or nothing more for a whole answer)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable, Iterable

from ballast.pipeline.asgi import JSON, header
from ballast.pipeline.errors import ApiError
from ballast.pipeline.shape import Rendering
from ballast.resilience.clock import SYSTEM_CLOCK
from ballast.types import BodyWriter, Message, Scope, Send

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


class Responder:
    """The one writer of a client's response: it wraps the server's `send`, knows whether
    the response started (the guard every stage asks before it answers), renders errors in
    the client's API `shape`, holds the server's fast body `writer`, and notes what the
    request log and metrics read when the request ends (status, first byte of a stream,
    whether a stream ended with an error event)."""

    __slots__ = (
        "_now",
        "_send",
        "began",
        "deployment",
        "error_code",
        "extra",
        "first",
        "request_id",
        "shape",
        "started",
        "status",
        "stream_error",
        "streaming",
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

    def send(self, message: Message) -> Awaitable[None]:
        """The server's `send`, after a look at the message (no coroutine of its own)."""
        if message["type"] == "http.response.body":
            if self.streaming:
                body = message.get("body", b"")
                if not self.first and body and not body.startswith(b":"):
                    self.first = self._now()
                elif body.startswith(_ERROR_EVENTS):
                    self.stream_error = True
        else:
            self.started = True
            self.status = message["status"]
        return self._send(message)

    def start_stream(self, headers: Headers, deployment: str | None) -> Message:
        """The start of a stream's response, noted as such."""
        headers.extend(self.extra)
        self.streaming = True
        if deployment is not None:
            self.deployment = deployment
        return {"type": "http.response.start", "status": 200, "headers": headers}

    async def answer(self, status: int, headers: Headers, body: bytes) -> None:
        headers.extend(self.extra)
        headers.append((b"content-length", str(len(body)).encode()))
        self.started = True
        self.status = status
        send = self._send
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def error(self, error: ApiError) -> None:
        """An error in the client's shape: a status and a body before the response started;
        an SSE error event that ends a started stream; nothing for a started answer."""
        self.error_code = error.code
        if not self.started:
            status, body = self.shape.error(error)
            await self.answer(status, [JSON, *error.headers], body)
        elif self.streaming:
            event = self.shape.error_event(error)
            self.stream_error = True
            await self._send({"type": "http.response.body", "body": event, "more_body": False})

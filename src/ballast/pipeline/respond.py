"""The client's side of a response: which upstream headers it may see, and the one place that
knows whether the response has started (before: an error is a status and a body; after: an
SSE error event, or nothing more for a whole answer)."""

from __future__ import annotations

from collections.abc import Iterable

from ballast.pipeline.asgi import JSON, send_bytes
from ballast.pipeline.errors import ApiError
from ballast.pipeline.shape import Rendering
from ballast.types import BodyWriter, Message, Send

Headers = list[tuple[bytes, bytes]]


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


class Responder:
    """Wraps the client's `send` and notes when the response started: the one guard every
    stage asks before it answers. Errors take the form of the client's API `shape`."""

    __slots__ = ("_send", "extra", "shape", "started", "streaming", "writer")

    def __init__(
        self,
        send: Send,
        extra: Headers,
        shape: Rendering = _OPENAI,
        writer: BodyWriter | None = None,
    ) -> None:
        self._send = send
        self.writer = writer  # the server's, for a body forwarded without `send`
        self.extra = extra  # Ballast's own headers on whatever answer goes out
        self.shape = shape
        self.started = False
        self.streaming = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def answer(self, status: int, headers: Headers, body: bytes) -> None:
        headers.extend(self.extra)
        self.started = True
        await send_bytes(self._send, status, headers, body)

    async def error(self, error: ApiError) -> None:
        """An error in the client's shape: a status and a body before the response started;
        an SSE error event that ends a started stream; nothing for a started answer."""
        if not self.started:
            status, body = self.shape.error(error)
            await self.answer(status, [JSON, *error.headers], body)
        elif self.streaming:
            event = self.shape.error_event(error)
            await self._send({"type": "http.response.body", "body": event, "more_body": False})

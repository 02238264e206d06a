"""The app's seam to the connection of one request (`types.BodyWriter`, in the scope under
`BODY_WRITER`): over uvicorn's request cycle, what its `send` does without a coroutine per
message and without its costs per header: a response's head built in one pass, a whole
answer written with its head, stream chunks written from the upstream's callback, and the
news that the client left. Only this module and the protocol touch the cycle's state.

Every head is the one uvicorn's `send` writes: the names, then the values, are checked by
one search over all of them (uvicorn searches twice per header), and the framing, the
connection's keep-alive and the cycle's state come out as `send` leaves them. Whatever is
not that plain case (a paused or gone client, an access line to log, headers uvicorn
refuses, a framing the body does not match) goes through uvicorn's `send` as before."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import NamedTuple

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

Headers = list[tuple[bytes, bytes]]


class Head(NamedTuple):
    """A response head as uvicorn's `send` makes it, and the cycle's state after it."""

    data: bytes
    keep_alive: bool
    chunked: bool | None  # None: neither framing (a HEAD request, 204, 304)
    length: int  # the content-length still to send; 0 when chunked


def build_head(status: int, headers: Headers, keep_alive: bool, method: str) -> Head | None:
    """The head for `headers` (the server's defaults first), or None when uvicorn's `send`
    must decide (headers it refuses, a content-length it reads otherwise)."""
    if HEADER_RE.search(b"".join([name for name, _ in headers])):
        return None
    if HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
        return None
    content = [STATUS_LINE[status]]
    chunked: bool | None = None
    length = 0
    closes = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length" and chunked is None:
            if not value.isdigit():
                return None
            length = int(value)
            chunked = False
        elif name == b"transfer-encoding" and value.lower() == b"chunked":
            length = 0
            chunked = True
        elif name == b"connection":
            if b"close" in [token.lower().strip() for token in value.split(b",")]:
                keep_alive = False
                closes = True
        content.extend((name, b": ", value, b"\r\n"))
    if not keep_alive and not closes:
        content.append(b"connection: close\r\n")
    if chunked is None and method != "HEAD" and status not in (204, 304):
        chunked = True
        content.append(b"transfer-encoding: chunked\r\n")
    content.append(b"\r\n")
    return Head(b"".join(content), keep_alive, chunked, length)


class CycleBodyWriter:
    """`types.BodyWriter` over one uvicorn request cycle.

    The writer lives in the scope the cycle holds, so it holds the cycle weakly: a strong
    reference back would make every request a reference cycle, left for the collector."""

    __slots__ = ("_cycle", "_gone")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._gone: Callable[[], None] | None = None

    @property
    def open(self) -> bool:
        cycle = self._cycle()
        return (
            cycle is not None
            and cycle.response_started
            and cycle.chunked_encoding is True
            and not cycle.response_complete
            and not cycle.disconnected
            and cycle.scope["method"] != "HEAD"
        )

    @property
    def body_complete(self) -> bool:
        cycle = self._cycle()
        return cycle is not None and cycle.more_body is False

    def start(self, status: int, headers: Headers) -> bool:
        cycle = self._plain()
        if cycle is None:
            return False
        method = cycle.scope["method"]
        head = build_head(status, cycle.default_headers + list(headers), cycle.keep_alive, method)
        if head is None:
            return False
        _started(cycle, head)
        cycle.transport.write(head.data)
        return True

    def answer(self, status: int, headers: Headers, body: bytes) -> bool:
        cycle = self._plain()
        if cycle is None or cycle.scope["method"] == "HEAD":
            return False
        head = build_head(status, cycle.default_headers + list(headers), cycle.keep_alive, "POST")
        if head is None or head.chunked is not False or head.length != len(body):
            return False
        _started(cycle, head)
        cycle.expected_content_length = 0
        cycle.transport.write(head.data + body)
        # The end of the response, as uvicorn's `send` ends it after the last body bytes.
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()
        return True

    def _plain(self) -> RequestResponseCycle | None:
        """The cycle, when nothing of its response went out and uvicorn's `send` would
        neither wait (a paused client), skip (a gone one) nor log an access line."""
        cycle = self._cycle()
        if (
            cycle is None
            or cycle.response_started
            or cycle.disconnected
            or cycle.flow.write_paused
            or (cycle.access_log and cycle.access_logger.isEnabledFor(logging.INFO))
        ):
            return None
        return cycle

    def write(self, body: bytes) -> bool:
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return not cycle.flow.write_paused

    async def drain(self) -> None:
        cycle = self._cycle()
        if cycle is not None and cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()

    def cork(self) -> None:
        cycle = self._cycle()
        if cycle is not None and not isinstance(cycle.transport, _Corked):
            cycle.transport = _Corked(cycle.transport)  # type: ignore[assignment]

    def uncork(self) -> None:
        cycle = self._cycle()
        if cycle is not None and isinstance(cycle.transport, _Corked):
            corked = cycle.transport
            cycle.transport = corked.transport
            corked.flush()

    def on_disconnect(self, callback: Callable[[], None] | None) -> bool:
        if callback is None:
            self._gone = None
            return True
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return False
        self._gone = callback
        return True

    def lost(self) -> None:
        """The client's connection is gone: the registered callback runs (once)."""
        callback, self._gone = self._gone, None
        if callback is not None:
            callback()


def _started(cycle: RequestResponseCycle, head: Head) -> None:
    """The cycle as uvicorn's `send` leaves it once `head` went out."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.keep_alive = head.keep_alive
    cycle.chunked_encoding = head.chunked
    cycle.expected_content_length = head.length


class _Corked:
    """A cycle's transport that holds its writes; anything else asked of it (closing it, its
    extra info) first writes what it holds, then is the real transport's."""

    __slots__ = ("parts", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def flush(self) -> None:
        parts = self.parts
        if parts:
            self.parts = []
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def __getattr__(self, name: str) -> object:
        self.flush()
        return getattr(self.transport, name)

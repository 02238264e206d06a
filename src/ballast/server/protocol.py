"""uvicorn's httptools protocol with the two limits it lacks: a request's headers must arrive
within `header_timeout` seconds and fit in `max_header_bytes`. A client trickling its headers
(slowloris) or sending an endless header block gets 408 / 431 and is disconnected, instead of
holding a connection and a growing buffer for as long as it likes.

The deadline is on the app's clock (`configure`), so a test moves it without waiting. Cost on
the hot path: a clock read and two flags per request (the connection's one timer is
re-armed about once per `header_timeout`, not per request); one length check per read while
headers are pending.

A kept-alive connection's idle timeout (`timeout_keep_alive`) runs on the same clock and the
same way, one timer per connection; uvicorn arms one at the end of every response.

Each request's cycle gets its body writer (writer.py), the app's seam to the connection;
`connection_lost` tells it the client left."""

from __future__ import annotations

import asyncio
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.resilience.failures import openai_error_body
from ballast.server.writer import CycleBodyWriter
from ballast.types import BODY_WRITER, WRITE_TIMED_OUT

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _raw_error(status: int, message: str, code: str) -> bytes:
    body = openai_error_body(message, "invalid_request_error", code)
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _HeadersTooLarge(Exception):
    """Raised in a parser callback to stop reading a request whose head is too large."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """Set the limits on the class (`configure`) before serving; each worker does so when
    it builds its app."""

    header_timeout: float = 10.0
    max_header_bytes: int = 64 * 1024
    client_write_timeout: float = 30.0
    clock: Clock = SYSTEM_CLOCK

    _write_timer: Timer | None = None

    _header_timer: Timer | None = None
    _header_bytes: int = 0  # read while the headers are pending (an endless header block)
    _head_size: int = 0  # the request line's target and header lines the parser gave us
    _oversized: bool = False
    _headers_since: float = 0.0
    _headers_pending: bool = False

    _idle_timer: Timer | None = None
    _idle_since: float | None = None  # when the last response ended; None: a request is on

    @classmethod
    def configure(
        cls,
        header_timeout: float,
        max_header_bytes: int,
        clock: Clock = SYSTEM_CLOCK,
        client_write_timeout: float = 30.0,
    ) -> None:
        cls.header_timeout = header_timeout
        cls.max_header_bytes = max_header_bytes
        cls.client_write_timeout = client_write_timeout
        cls.clock = clock

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._begin_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_pending = False
        self._idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None:
            writer = cycle.scope.get(BODY_WRITER)
            if isinstance(writer, CycleBodyWriter):
                writer.lost()

    # A client that stops reading: uvicorn's `send` waits while the transport is paused
    # (its buffer full), which pauses the stream and, with it, the upstream's reads. Paused
    # for `client_write_timeout`, the connection is aborted: the app sees a disconnect (the
    # scope says why) and drops its upstream request. No cost per write: only a pause and
    # its resume arm and cancel the timer.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.clock.call_later(
                self.client_write_timeout, self._write_timed_out
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        cycle = self.cycle
        if cycle is not None:
            cast(dict[str, object], cycle.scope)[WRITE_TIMED_OUT] = True
        self.transport.abort()

    # A kept-alive connection idle for `timeout_keep_alive` is closed, as uvicorn closes it,
    # on the app's clock and by the connection's one timer, armed only when none is: uvicorn
    # arms a timer at the end of every response and cancels it when the next request comes.

    def on_response_complete(self) -> None:
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()  # a pipelined request starts; or nothing does
            return
        # uvicorn's own steps, its timer left out.
        self.server_state.total_requests += 1
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        self._idle_since = self.clock.monotonic()
        if self._idle_timer is None:
            self._idle_timer = self.clock.call_later(self.timeout_keep_alive, self._check_idle)

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None
        super()._unset_keepalive_if_required()

    def _check_idle(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None:
            return  # a request is on: the end of its response arms the timer again
        left = since + self.timeout_keep_alive - self.clock.monotonic()
        if left > 0:  # idle since after the timer was armed: wait out its own time
            self._idle_timer = self.clock.call_later(left, self._check_idle)
            return
        self.timeout_keep_alive_handler()

    def _begin_headers(self) -> None:
        """A request's headers start arriving. The connection's one timer is armed only when
        none is: on a busy keep-alive connection it fires about once per `header_timeout`,
        not once per request."""
        self._headers_pending = True
        self._header_bytes = 0
        self._head_size = 0
        self._headers_since = self.clock.monotonic()
        if self._header_timer is None:
            self._header_timer = self.clock.call_later(self.header_timeout, self._check_headers)

    def _check_headers(self) -> None:
        self._header_timer = None
        if not self._headers_pending:
            return  # between requests: the next request arms it again
        late = self._headers_since + self.header_timeout - self.clock.monotonic()
        if late > 0:  # this request began after the timer was armed: wait out its own time
            self._header_timer = self.clock.call_later(late, self._check_headers)
            return
        self._reject(408, "The request headers did not arrive in time.", "request_timeout")

    def _reject(self, status: int, message: str, code: str) -> None:
        self._headers_pending = False
        if not self.transport.is_closing():
            self.transport.write(_raw_error(status, message, code))
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # A header block that came whole in one read ended before `data_received` could
        # count it, so the parser's own pieces are counted as well.
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.max_header_bytes:
            self._oversized = True
            raise _HeadersTooLarge  # ends the parse: uvicorn answers via send_400_response

    def send_400_response(self, msg: str) -> None:
        if self._oversized:
            self._reject(431, "The request headers are larger than allowed.", "headers_too_large")
            return
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin_headers()

    def on_headers_complete(self) -> None:
        self._headers_pending = False
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            self.scope[BODY_WRITER] = CycleBodyWriter(cycle)  # type: ignore[literal-required]

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._headers_pending:
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._reject(
                    431, "The request headers are larger than allowed.", "headers_too_large"
                )

"""The connection protocol: one socket to one origin, carrying one exchange at a time.
httptools parses the answer's bytes as they arrive and this protocol feeds them to the
`Response`, which it made when the request went out.

Why apart from the pool: it is the per-socket state machine (framing, content-encoding,
limits on the header block, the end of an answer, a broken connection), while the pool
decides which socket a request gets. It sees its pool through `ConnectionPool`, so the
pool may import it without a circle.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Protocol, cast

import httptools

from ballast.upstream.http_common import BadResponse, Disconnected, Origin
from ballast.upstream.response import CarrierPool, Response


class ConnectionPool(CarrierPool["_Connection"], Protocol):
    """What a connection asks of the pool that opened it (`pool.Pool`)."""

    max_head: int

    def forget(self, conn: _Connection) -> None: ...


class _Connection(asyncio.Protocol):
    """One socket to one origin, carrying one exchange at a time."""

    def __init__(self, pool: ConnectionPool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        # Made when the socket is, dropped when it closes: the parser holds this
        # connection's callbacks, so a closed connection keeping it would be a reference
        # cycle (with the last answer's buffers in it) left for the collector.
        self.parser: httptools.HttpResponseParser | None = None
        self.response: Response | None = None
        self.closed = False
        self.idle_since = 0.0
        self.uses = 0  # requests sent on it; past one, it was reused from the pool
        self.head_size = 0  # the current answer's header lines, as the parser gave them

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.parser = httptools.HttpResponseParser(self)

    def send(self, head: bytes, body: bytes) -> Response:
        response = Response(self)
        self.response = response
        self.uses += 1
        self.head_size = 0
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            response._fail(Disconnected("upstream connection closed"))
        else:
            if len(body) < 65536:  # one write; a big body is not copied to join it
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
        return response

    def data_received(self, data: bytes) -> None:
        response = self.response
        parser = self.parser
        if response is None or response.complete or parser is None:
            self.abort()  # bytes nobody asked for: the connection is out of step
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            response._fail(BadResponse("upstream switched protocols"))
            self.abort()
            return
        except httptools.HttpParserError:
            response._fail(BadResponse("upstream sent a malformed HTTP answer"))
            self.abort()
            return
        if not response.headers_done:
            response._head_bytes += len(data)
            if response._head_bytes > self.pool.max_head:  # an endless header block
                response._fail(BadResponse("upstream's answer headers are too large"))
                self.abort()

    def on_message_begin(self) -> None:
        response = self.response
        if response is None or response.complete:
            raise BadResponse("upstream sent an answer nobody asked for")  # ends the parse

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is not None:
            # A header block that came whole in one read ends before `data_received` counts
            # it: the parser's own pieces count too.
            self.head_size += len(name) + len(value) + 4
            if self.head_size > self.pool.max_head:
                response._fail(BadResponse("upstream's answer headers are too large"))
                raise BadResponse("headers too large")  # ends the parse; the error is set
            response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        parser = self.parser
        if parser is None:
            return
        status = parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the real answer follows
            response.raw_headers.clear()
            return
        response.status = status
        response.keep_alive = parser.should_keep_alive()
        framed = False
        coding = b""
        for name, value in response.raw_headers:
            lowered = name.lower()
            if lowered == b"content-length":
                framed = True
                response.length = int(value)  # the parser has checked its digits
            elif lowered == b"transfer-encoding":
                framed = True
            elif lowered == b"content-encoding":
                coding = value.strip().lower()
            elif lowered == b"content-type":
                response.content_type = value.decode("latin-1")
        if not framed and status not in (204, 304):
            response._until_eof = True
            response.keep_alive = False
        if coding in (b"gzip", b"x-gzip"):
            response._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == b"deflate":
            response._decoder = zlib.decompressobj()
        elif coding not in (b"", b"identity"):
            response._fail(BadResponse(f"upstream sent an unreadable {coding.decode()} body"))
            self.abort()
            return
        response.headers_done = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None:
            response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or not response.headers_done:
            return
        response._end()
        drain = response._drain
        if drain is not None:  # released before its end, and now ended in time
            response._drain = None
            drain.cancel()
            self.pool.put_back(self)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.parser = None
        self.pool.forget(self)
        response = self.response
        if response is None or response.complete:
            return
        if response._drain is not None:
            response._drain.cancel()
            response._drain = None
        if response.headers_done and response._until_eof and exc is None:
            response._end()
        elif response.headers_done:
            response._fail(Disconnected("upstream connection broke mid-answer"))
        else:
            response._fail(Disconnected("upstream closed the connection before answering"))

    def abort(self) -> None:
        """Drop the connection now (a reset rather than a graceful close: nothing of it is
        worth waiting for)."""
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            self.pool.forget(self)

"""One answer from an upstream: its status and headers, then its body as it arrives,
buffered up to a bound, decoded when it came gzip- or deflate-encoded.

Decoding is bounded too: each step inflates at most the room left under the pool's
`high_water`, keeping the rest of the compressed input (with the socket paused) until the
reader takes what was decoded. A gzip bomb (a few MB that inflate to GBs) thus costs a
bounded buffer, and `read(max_size=...)` ends it when the decoded body passes the limit.

Why apart from the connection: this is what callers hold and read (the exchange, the
client); the connection protocol only feeds it. It sees its connection through the small
`Carrier` protocol below, so the two modules do not import each other.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable
from typing import Protocol, Self, TypeVar

from ballast.resilience.clock import Clock, Timer
from ballast.upstream.http_common import BadResponse, Headers, HttpError, TooLarge, again

_Conn = TypeVar("_Conn", contravariant=True)


class CarrierPool(Protocol[_Conn]):
    """What an answer asks of the pool its connection belongs to (`pool.Pool`)."""

    high_water: int
    drain_timeout: float
    clock: Clock

    def put_back(self, conn: _Conn) -> None: ...


class Carrier(Protocol):
    """The connection an answer arrives on, as the answer sees it (`connection.py`)."""

    transport: asyncio.Transport | None
    closed: bool

    @property
    def pool(self) -> CarrierPool[Self]: ...

    def abort(self) -> None: ...


class Response:
    """One answer: its status and headers once they arrived, then its body as it comes.
    `release` gives the connection back when the body was read to its end, and drops it
    otherwise; `close` always drops it."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_compressed",
        "_conn",
        "_decoder",
        "_drain",
        "_error",
        "_head_bytes",
        "_headers",
        "_paused",
        "_until_eof",
        "_waiter",
        "complete",
        "consumer",
        "content_type",
        "headers_done",
        "high_water",
        "keep_alive",
        "length",
        "raw_headers",
        "status",
    )

    def __init__(self, conn: Carrier) -> None:
        self._conn: Carrier | None = conn
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._headers: Headers | None = None
        self._head_bytes = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.length = -1  # the content-length the answer announced, -1 when it did not
        self.content_type = ""  # as the answer gave it (read with the framing headers)
        self._until_eof = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: HttpError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: zlib._Decompress | None = None
        self._compressed = b""  # encoded input not inflated yet (the reader is behind)
        # Buffered body bytes at which the socket stops being read; the pool's unless the
        # reader sets less (an event stream: its reader relays what it takes at once).
        self.high_water = conn.pool.high_water
        self._drain: Timer | None = None  # released, the rest being discarded
        # A reader that takes the body as it arrives, in the connection's callback (an event
        # stream's pump), instead of having it buffered and its task woken for each piece.
        self.consumer: Callable[[bytes], None] | None = None

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self.raw_headers)
        return self._headers

    # -- reading ----------------------------------------------------------------------------

    def read_nowait(self) -> bytes:
        """The body bytes buffered now (b"" when none). Raises the connection's error once
        the bytes before it were taken."""
        chunks = self._chunks
        if not chunks and self._compressed:
            self._inflate(b"")
        if chunks:
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self._buffered = 0
            if self._paused and not self._compressed:
                self._resume()
            return data
        if self._error is not None:
            raise again(self._error)
        return b""

    def at_eof(self) -> bool:
        return self.complete and not self._chunks and not self._compressed

    async def readany(self) -> bytes:
        """The next body bytes, waiting for them; b"" at the end of the body."""
        while (
            not self._chunks and not self._compressed and not self.complete and self._error is None
        ):
            await self._wait()
        return self.read_nowait()

    async def read(self, limit: int = -1, max_size: int = -1) -> bytes:
        """The whole body, or its first `limit` bytes. A body past `max_size` bytes raises
        TooLarge and drops the connection; nothing read of it is kept. One that announces
        more than `max_size` (a content-length, not encoded) is refused before any is read."""
        if 0 <= max_size < self.length and self._decoder is None:
            self.close()
            raise TooLarge(f"the answer announces {self.length} bytes, over {max_size}")
        parts: list[bytes] = []
        size = 0
        try:
            while limit < 0 or size < limit:
                data = await self.readany()
                if not data:
                    break
                parts.append(data)
                size += len(data)
                if 0 <= max_size < size:
                    self.close()
                    raise TooLarge(f"the answer is larger than {max_size} bytes")
        except BaseException:
            # The error's traceback keeps this frame alive as long as the error lives (in
            # a failure's context, a log record, a cycle the collector has yet to find):
            # it must not keep the body read so far.
            parts.clear()
            data = b""
            raise
        body = b"".join(parts)
        return body if limit < 0 else body[:limit]

    @property
    def failed(self) -> bool:
        return self._error is not None

    @property
    def pending(self) -> bool:
        """Body bytes are buffered (or wait to be inflated) for a reader to take."""
        return bool(self._chunks or self._compressed)

    async def wait(self) -> None:
        """Until the body ends, the connection fails or `wake` is called: for a `consumer`,
        which is handed the bytes themselves."""
        if not self.complete and self._error is None:
            await self._wait()

    def wake(self) -> None:
        self._wake()

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self._error is not None:
                raise again(self._error)
            await self._wait()

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume(self) -> None:
        self._paused = False
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.closed:
            conn.transport.resume_reading()

    # -- fed by the connection ---------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._drain is not None:
            return
        if self._decoder is not None:
            self._inflate(data)
            return
        self._append(data)

    def _append(self, data: bytes) -> None:
        consumer = self.consumer
        if consumer is not None:
            consumer(data)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        conn = self._conn
        if conn is not None and self._buffered > self.high_water and not self._paused:
            self._pause()
        self._wake()

    def _pause(self) -> None:
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.closed:
            self._paused = True
            conn.transport.pause_reading()

    def _inflate(self, data: bytes) -> None:
        """Decode at most the room left under the high-water mark; the rest of the input
        waits (the socket paused) until the reader has taken what is buffered."""
        decoder = self._decoder
        assert decoder is not None
        pending = self._compressed + data if self._compressed else data
        room = self.high_water - self._buffered
        if room <= 0:
            self._compressed = pending
            if not self._paused:
                self._pause()
            return
        try:
            out = decoder.decompress(pending, room)
            self._compressed = decoder.unconsumed_tail
            if self.complete and not self._compressed:
                out += decoder.flush()
        except zlib.error:
            self._compressed = b""
            self._fail(BadResponse("upstream sent a body its content-encoding cannot read"))
            if self._conn is not None:
                self._conn.abort()
            return
        if self._compressed and not self._paused:
            self._pause()
        if out:
            self._append(out)

    def _end(self) -> None:
        self.complete = True
        if self._decoder is not None and not self._compressed:
            try:
                rest = self._decoder.flush()
            except zlib.error:
                rest = b""
            if rest:
                self._chunks.append(rest)
        self._wake()

    def _fail(self, error: HttpError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._wake()

    # -- giving the connection back ----------------------------------------------------------

    def release(self) -> None:
        """Give the connection back. An answer whose reader stopped just before its end (an
        event stream's final chunk often comes a moment after `[DONE]`) keeps its connection
        if the rest arrives within the pool's `drain_timeout`; its bytes are discarded."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reusable = self._error is None and self.keep_alive and not conn.closed
        if reusable and self.complete:
            conn.pool.put_back(conn)
        elif reusable and self.headers_done and not self._until_eof:
            self._chunks.clear()
            self._compressed = b""
            self._buffered = 0
            self._drain = conn.pool.clock.call_later(conn.pool.drain_timeout, conn.abort)
            if self._paused and conn.transport is not None:
                self._paused = False
                conn.transport.resume_reading()
        else:
            conn.abort()

    def close(self) -> None:
        """Drop the connection and whatever of the body is still buffered."""
        self._chunks.clear()
        self._compressed = b""
        self._buffered = 0
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

"""A lean HTTP/1.1 client for the request path: pooled keep-alive connections to upstreams.

Why: aiohttp's ClientSession spends about 75 us of CPU on one request on a small machine (a
request object, timer contexts, header multidicts, cookie filtering, a stream reader and its
callbacks), which was a third of a proxied request's whole cost. This client writes a request
in one go, parses the answer with httptools (the C parser uvicorn uses) straight into a small
response object, and hands the connection back to its pool once the answer was read to the
end: about 10 us a request.

Connections may go through an outbound proxy (`proxy.py` decides which, once per origin): a
CONNECT tunnel for https, the proxy itself for plain http.

It is a transport and nothing more: deadlines, stream clocks, retries and the error taxonomy
stay with the exchange, which owns every wait and cancels it. It speaks HTTP/1.1 over TCP or
TLS. Answers may be framed by length, by chunks or by the end of the connection; a body sent
gzip- or deflate-encoded although we ask for identity is decoded. A body nobody reads stops
the socket being read once a bounded buffer is full.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import zlib
from collections import deque
from functools import lru_cache
from typing import NamedTuple, Protocol, cast
from urllib.parse import urlsplit

import httptools

from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.resilience.deadline import Deadline

HIGH_WATER = 256 * 1024  # buffered body bytes at which reading from the socket pauses
MAX_HEAD = 64 * 1024  # the most an answer's status line and headers may take
DRAIN_TIMEOUT = 1.0  # seconds a released answer's last bytes may take to keep its connection


class HttpError(Exception):
    """An exchange that ended before its answer was complete."""


class ConnectFailed(HttpError):
    """No connection could be opened (refused, unknown host, TLS handshake)."""


class ConnectTimeout(ConnectFailed):
    pass


class PoolTimeout(HttpError):
    """Every connection of the pool stayed busy for the whole wait."""


class Disconnected(HttpError):
    """The connection closed or broke before the answer ended."""


class BadResponse(HttpError):
    """The upstream's bytes are not an HTTP/1.1 answer we can read."""


class Origin(NamedTuple):
    tls: bool
    host: str
    port: int
    host_header: bytes  # the request's `host` line, ready to write


class ProxyHop(Protocol):
    """A proxy a connection goes through (see `proxy.py`)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    async def tunnel(
        self, origin: Origin, context: ssl.SSLContext, protocol: asyncio.Protocol
    ) -> asyncio.Transport: ...


class ProxyChoice(Protocol):
    """Which proxy, if any, serves an origin (`proxy.ProxyPolicy`)."""

    def for_origin(self, origin: Origin) -> ProxyHop | None: ...


@lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, bytes]:
    """Where a URL is served and the request target to ask there. ValueError if it is not an
    http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    tls = parts.scheme == "https"
    default = 443 if tls else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    if port != default:
        shown = f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n") or any(c in shown for c in "\r\n"):
        raise ValueError("URL has whitespace in it")
    origin = Origin(tls, host, port, b"host: " + shown.encode("idna") + b"\r\n")
    return origin, target.encode("ascii")


# What a header value must not hold: C0 controls but tab (CR, LF and NUL among them), and DEL.
_BAD_VALUE = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


_CHECKED_NAMES: set[str] = set()


def header_line(name: str, value: str) -> bytes:
    """One request header line, ending in CRLF. ValueError for a name or value that would
    break the framing (header injection), hold a control character, or not be Latin-1 (sent
    as is, never silently turned into something else). Configured headers are checked
    more strictly when the config loads; this guards values that arrive with a request."""
    if name not in _CHECKED_NAMES:
        if not name or any(c in name for c in " \t\r\n:"):
            raise ValueError(f"invalid header {name!r}")
        if len(_CHECKED_NAMES) < 256:
            _CHECKED_NAMES.add(name)  # a request writes the same few names every time
    if not value.isprintable() and _BAD_VALUE.search(value):  # the usual value is printable
        raise ValueError(f"invalid header {name!r}")
    try:
        return f"{name}: {value}\r\n".encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"invalid header {name!r}: not Latin-1") from None


def header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(header_line(name, value) for name, value in headers.items())


class Headers:
    """Case-insensitive lookup over an answer's raw headers; the first value wins."""

    __slots__ = ("_map",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        found: dict[str, str] = {}
        for name, value in raw:
            found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        self._map = found

    def get(self, name: str) -> str | None:
        return self._map.get(name.lower())


class Response:
    """One answer: its status and headers once they arrived, then its body as it comes.
    `release` gives the connection back when the body was read to its end, and drops it
    otherwise; `close` always drops it."""

    __slots__ = (
        "_buffered",
        "_chunks",
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
        "headers_done",
        "keep_alive",
        "raw_headers",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._headers: Headers | None = None
        self._head_bytes = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self._until_eof = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: HttpError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: zlib._Decompress | None = None
        self._drain: Timer | None = None  # released, the rest being discarded

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
        if chunks:
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self._buffered = 0
            if self._paused:
                self._resume()
            return data
        if self._error is not None:
            raise self._error
        return b""

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    async def readany(self) -> bytes:
        """The next body bytes, waiting for them; b"" at the end of the body."""
        while not self._chunks and not self.complete and self._error is None:
            await self._wait()
        return self.read_nowait()

    async def read(self, limit: int = -1) -> bytes:
        """The whole body, or its first `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        while limit < 0 or size < limit:
            data = await self.readany()
            if not data:
                break
            parts.append(data)
            size += len(data)
        body = b"".join(parts)
        return body if limit < 0 else body[:limit]

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self._error is not None:
                raise self._error
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
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._fail(BadResponse("upstream sent a body its content-encoding cannot read"))
                if self._conn is not None:
                    self._conn.abort()
                return
            if not data:
                return
        self._chunks.append(data)
        self._buffered += len(data)
        conn = self._conn
        if conn is not None and self._buffered > conn.pool.high_water and not self._paused:
            if conn.transport is not None:
                self._paused = True
                conn.transport.pause_reading()
        self._wake()

    def _end(self) -> None:
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._chunks.append(rest)
        self.complete = True
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
            self._buffered = 0
            self._drain = conn.pool.clock.call_later(conn.pool.drain_timeout, conn.abort)
            if self._paused and conn.transport is not None:
                self._paused = False
                conn.transport.resume_reading()
        else:
            conn.abort()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()


class _Connection(asyncio.Protocol):
    """One socket to one origin, carrying one exchange at a time."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.idle_since = 0.0
        self.uses = 0  # requests sent on it; past one, it was reused from the pool

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self, head: bytes, body: bytes) -> Response:
        response = Response(self)
        self.response = response
        self.uses += 1
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
        if response is None or response.complete:
            self.abort()  # bytes nobody asked for: the connection is out of step
            return
        try:
            self.parser.feed_data(data)
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
            response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        parser = self.parser
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
            if lowered == b"content-length" or lowered == b"transfer-encoding":
                framed = True
            elif lowered == b"content-encoding":
                coding = value.strip().lower()
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


class Pool:
    """Bounded keep-alive connections for one deployment (a bulkhead), to its base URL's
    origin and to any per-run endpoint it hands out. The newest idle connection is reused
    first, so the rest age out after `keepalive` seconds.

    An idle connection the upstream closed just as we reused it (the keep-alive race) is
    not the upstream failing: such a request is sent once more on a new connection, which
    `silent_retries` counts, and the caller never sees it."""

    def __init__(
        self,
        limit: int,
        keepalive: float,
        connect_timeout: float,
        pool_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        proxies: ProxyChoice | None = None,
        high_water: int = HIGH_WATER,
        max_head: int = MAX_HEAD,
        drain_timeout: float = DRAIN_TIMEOUT,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.limit = limit
        self.clock = clock  # every timer of the pool: connect, wait for a turn, drain, idle
        self.drain_timeout = drain_timeout
        self.high_water = high_water
        self.max_head = max_head
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self._ssl = ssl_context
        self._proxies = proxies
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: Timer | None = None
        self._closed = False
        self.silent_retries = 0

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return len(self._open) + self._opening

    @property
    def idle(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def request(self, origin: Origin, head: bytes, body: bytes) -> Response:
        """Send a request (`head` is its request line and headers) on a pooled connection and
        return once the answer's headers arrived. The caller must `release` or `close` it."""
        conn = await self.acquire(origin)
        response = conn.send(head, body)
        try:
            await response.wait_headers()
        except Disconnected:
            response.close()
            if conn.uses < 2 or response._head_bytes:
                raise  # a new connection failing, or an answer begun: the caller's to judge
        except BaseException:
            response.close()
            raise
        else:
            return response
        # The reused connection had been closed before a byte of an answer came: the
        # upstream dropped it idle, so the request is sent once more on a new one.
        self.silent_retries += 1
        conn = await self.acquire(origin, fresh=True)
        response = conn.send(head, body)
        try:
            await response.wait_headers()
        except BaseException:
            response.close()
            raise
        return response

    async def acquire(self, origin: Origin, fresh: bool = False) -> _Connection:
        """A connection to `origin`: the newest idle one, else a new one (always a new one
        when `fresh`), waiting up to `pool_timeout` for room."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if self._closed:
                raise ConnectFailed("the connection pool is closed")
            conn = None if fresh else self._take_idle(origin, self.clock.monotonic())
            if conn is not None:
                return conn
            if self.size < self.limit or self._evict_idle():
                return await self._connect(origin)
            if deadline is None:
                deadline = self.clock.monotonic() + self.pool_timeout
            await self._wait_turn(loop, deadline)

    def _take_idle(self, origin: Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                conn.abort()
            elif now - conn.idle_since >= self.keepalive:
                conn.abort()
            else:
                return conn
        return None

    def _evict_idle(self) -> bool:
        """Close an idle connection to another origin to make room; False if none is idle."""
        for idle in self._idle.values():
            if idle:
                idle[0].abort()
                return True
        return False

    async def _wait_turn(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            with Deadline(self.clock, deadline):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken but leaving: pass the turn on
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise PoolTimeout(
                    f"no free connection within {self.pool_timeout:g}s ({self.limit} busy)"
                ) from None
            raise

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        self._opening += 1
        try:
            with Deadline(self.clock, self.clock.monotonic() + self.connect_timeout):
                conn = await self._dial(loop, origin)
        except BaseException as exc:
            self._opening -= 1
            self._wake_one()  # a failed attempt leaves room for a waiter
            if isinstance(exc, TimeoutError):
                raise ConnectTimeout(f"no connection within {self.connect_timeout:g}s") from None
            if isinstance(exc, ssl.SSLError):
                raise ConnectFailed(f"TLS handshake failed: {exc.reason or exc}") from None
            if isinstance(exc, OSError):
                raise ConnectFailed(f"could not connect: {exc.strerror or exc}") from None
            raise
        self._opening -= 1
        if conn.closed:
            raise Disconnected("upstream closed the connection at once")
        self._open.add(conn)
        return conn

    async def _dial(self, loop: asyncio.AbstractEventLoop, origin: Origin) -> _Connection:
        """A new connection to `origin`: direct, to a forward proxy (plain http, the request
        names the origin), or through a proxy's CONNECT tunnel (https)."""
        proxy = self._proxies.for_origin(origin) if self._proxies is not None else None
        context = (self._ssl or default_tls_context()) if origin.tls else None
        if proxy is not None and context is not None:
            conn = _Connection(self, origin)
            conn.connection_made(await proxy.tunnel(origin, context, conn))
            return conn
        host, port = (origin.host, origin.port) if proxy is None else (proxy.host, proxy.port)
        if context is None:
            _, conn = await loop.create_connection(lambda: _Connection(self, origin), host, port)
        else:
            _, conn = await loop.create_connection(
                lambda: _Connection(self, origin),
                host,
                port,
                ssl=context,
                server_hostname=origin.host,
            )
        return conn

    def put_back(self, conn: _Connection) -> None:
        conn.response = None
        if self._closed:
            conn.abort()
            return
        conn.idle_since = self.clock.monotonic()
        self._idle.setdefault(conn.origin, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.clock.call_later(self.keepalive, self._sweep)
        if self._waiters:
            self._wake_one()

    def forget(self, conn: _Connection) -> None:
        """A connection closed: it leaves the pool and makes room."""
        if conn in self._open:
            self._open.discard(conn)
            idle = self._idle.get(conn.origin)
            if idle and conn in idle:
                idle.remove(conn)
            if self._waiters:
                self._wake_one()

    def _sweep(self) -> None:
        """Close connections idle for `keepalive` seconds, so unused ones do not linger."""
        self._sweeper = None
        now = self.clock.monotonic()
        oldest: float | None = None
        for origin, idle in list(self._idle.items()):
            for conn in [c for c in idle if now - c.idle_since >= self.keepalive]:
                conn.abort()
            if idle:
                first = min(c.idle_since for c in idle)
                oldest = first if oldest is None else min(oldest, first)
            else:
                del self._idle[origin]
        if oldest is not None:
            self._sweeper = self.clock.call_at(oldest + self.keepalive, self._sweep)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


@lru_cache(maxsize=1)
def default_tls_context() -> ssl.SSLContext:
    """The system's trust store, as aiohttp and the OpenAI SDK use it (SSL_CERT_FILE too)."""
    return ssl.create_default_context()

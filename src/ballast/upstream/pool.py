"""The bounded pool of keep-alive connections of one deployment, and how a new connection
is dialled: directly, to a forward proxy, or through a proxy's CONNECT tunnel.

Why a module of its own: it is the only part of the client that waits for room, opens
sockets, times out and retries the keep-alive race; the connection protocol and the
response it hands out know nothing of pooling.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from functools import lru_cache
from typing import Protocol

from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.resilience.deadline import Deadline
from ballast.upstream.connection import _Connection
from ballast.upstream.http_common import (
    MAX_HEAD,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    Origin,
    PoolTimeout,
)
from ballast.upstream.response import Response

HIGH_WATER = 256 * 1024  # buffered body bytes at which reading from the socket pauses
DRAIN_TIMEOUT = 1.0  # seconds a released answer's last bytes may take to keep its connection


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

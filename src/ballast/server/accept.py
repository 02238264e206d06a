"""uvloop, with listening sockets that accept a batch of connections per readiness.

libuv (since 1.45) accepts one connection per turn of the event loop and leaves the next
to level-triggered polling. On an idle worker a turn is short; under load one turn handles
the events of hundreds of sockets, and a burst of new connections (a load balancer
refilling its pool, clients reconnecting after a blip) waits in the kernel's accept queue,
a few taken per turn, for seconds: 400 connections took 2.5 s to be accepted by a worker
serving 512 others, and their first requests saw a p99 of 2-3 s. Here the loop's own reader
on the socket accepts up to `accept_batch` at once, as asyncio's selector loop does, and
hands each to uvloop (`connect_accepted_socket`), which runs it as before.

The server is uvicorn's as always: it passes its listening sockets to `create_server`
(`serving.run_server` binds them itself for one worker too). Anything else (a Unix socket,
a host and port) goes to uvloop's own server unchanged."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvloop

log = logging.getLogger("ballast.serve")

# Out of descriptors or memory: accepting again at once would spin; asyncio waits a second.
_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
RETRY_AFTER_RESOURCE_ERROR = 1.0


class BatchAcceptServer(asyncio.AbstractServer):
    """One listening socket, read by the loop: up to `batch` connections per readiness."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        ssl: Any,
        batch: int,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = protocol_factory
        self._ssl = ssl
        self._batch = batch
        self._reading = False
        self._closed = False
        self._ended = asyncio.Event()  # set by close()
        self._opening: set[asyncio.Task[Any]] = set()  # accepted, connection_made pending
        sock.setblocking(False)
        self._read()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._closed else (self._sock,)

    def _read(self) -> None:
        if not self._reading and not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while queued
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRORS:
                    raise
                log.error("cannot accept connections for now: %s", exc.strerror)
                self._pause()
                self._loop.call_later(RETRY_AFTER_RESOURCE_ERROR, self._read)
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
        except asyncio.CancelledError:
            conn.close()  # shut down before it was served
            raise
        except (OSError, ValueError) as exc:  # reset meanwhile, or a failed TLS handshake
            conn.close()
            log.debug("an accepted connection could not be opened: %s", exc)

    def close(self) -> None:
        if self._closed:
            return
        self._pause()
        self._closed = True
        self._sock.close()
        self._ended.set()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._closed

    async def start_serving(self) -> None:
        self._read()

    async def serve_forever(self) -> None:
        await self._ended.wait()

    async def wait_closed(self) -> None:
        """Connections end under uvicorn's own watch; here only those not yet opened."""
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)


class GatewayLoop(uvloop.Loop):
    """uvloop's loop; its TCP servers accept in batches (the module docstring says why)."""

    accept_batch = 128  # set from `server.accept_batch` when the app is built

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: Any = None,
        port: Any = None,
        *,
        sock: socket.socket | None = None,
        ssl: Any = None,
        **options: Any,
    ) -> asyncio.AbstractServer:
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return await super().create_server(
                protocol_factory, host, port, sock=sock, ssl=ssl, **options
            )
        return BatchAcceptServer(self, sock, protocol_factory, ssl, max(1, self.accept_batch))

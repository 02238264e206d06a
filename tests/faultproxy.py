"""A TCP fault proxy for tests: sits between a client and a real service on 127.0.0.1 and
misbehaves on demand, so faults come from the network and not from mocks in the code
under test.

    async with FaultProxy("127.0.0.1", redis_port) as proxy:   # or: port = await proxy.start()
        client = connect(port=proxy.port)
        proxy.blackhole()        # accept, forward nothing, never answer
        proxy.delay(30.0)        # replies (target -> client) arrive 30 s late
        proxy.reset()            # RST every open connection and each new one
        proxy.passthrough()      # back to forwarding
                                 # (await proxy.close() when not used as a context manager)

Modes apply at once, to open connections too, with two exceptions worth knowing:
- bytes that arrive while blackholed are dropped, never delivered later; a client that
  keeps using such a connection is out of step with the server (clients normally drop a
  connection whose call timed out), and a connection *accepted* while blackholed never
  reaches the target, whatever the mode becomes later;
- a delay applies to each chunk as it arrives (chunks keep their order and their spacing,
  the delay does not accumulate); data from the client to the target is never delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType
from typing import Literal

Mode = Literal["pass", "blackhole", "delay", "reset"]

_CHUNK = 65536


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = 0
        self.accepted = 0  # connections accepted so far
        self._mode: Mode = "pass"
        self._delay = 0.0
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}

    # -- modes ---------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    def passthrough(self) -> None:
        """Forward everything (the initial mode)."""
        self._mode, self._delay = "pass", 0.0

    def blackhole(self) -> None:
        """Accept connections, forward nothing, never answer, never close."""
        self._mode = "blackhole"

    def delay(self, seconds: float) -> None:
        """Forward, delivering each chunk from the target `seconds` after it arrived."""
        self._mode, self._delay = "delay", max(0.0, seconds)

    def reset(self) -> None:
        """Close every open connection with a TCP RST, and each new one as it arrives."""
        self._mode = "reset"
        for task, writers in list(self._conns.items()):
            for w in writers[:1]:  # the client side
                _abort(w)
            task.cancel()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> int:
        """Listen on a free port of `host`; returns it (also in `.port`)."""
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening and drop every connection (pending delayed data is discarded)."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._conns)
        for task, writers in list(self._conns.items()):
            for w in writers:
                _abort(w)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- plumbing --------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._mode == "reset":
            _abort(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        writers = [writer]
        self._conns[task] = writers
        try:
            if self._mode == "blackhole":
                while await reader.read(_CHUNK):
                    pass
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                _abort(writer)
                return
            writers.append(up_writer)
            pumps = [
                asyncio.create_task(self._pump(reader, up_writer, replies=False)),
                asyncio.create_task(self._pump(up_reader, writer, replies=True)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only reset() and close() cancel a connection, and asyncio's stream server
            # (3.11) would log a cancelled handler as an error: end quietly.
            pass
        finally:
            self._conns.pop(task, None)
            resetting = self.mode == "reset"  # (it may have changed while we waited)
            for w in writers:
                if resetting:
                    _abort(w)
                else:
                    w.close()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, replies: bool
    ) -> None:
        """Read chunks as they come; a writer delivers each one when it is due."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if self._mode == "blackhole":
                    continue
                dst.write(data)
                await dst.drain()

        writer = asyncio.create_task(deliver())
        try:
            while data := await src.read(_CHUNK):
                if self._mode == "blackhole":
                    continue
                delay = self._delay if (replies and self._mode == "delay") else 0.0
                queue.put_nowait((loop.time() + delay, data))
            queue.put_nowait(None)
            await writer
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

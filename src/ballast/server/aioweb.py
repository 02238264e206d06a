"""Serving the small aiohttp services (the simulator, the sampling actor) the same way."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Self

from aiohttp import web


class CannotListen(OSError):
    """The address cannot be bound (in use, not this machine's, not allowed): a command
    says so in one line rather than with a traceback."""


async def start_site(
    app: web.Application,
    host: str,
    port: int,
    shutdown_timeout: float,
    handler_cancellation: bool = False,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0 picks a free port); the runner and the bound port."""
    # shutdown_timeout bounds how long cleanup waits for hanging handlers.
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=handler_cancellation,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        shown = f"[{host}]" if ":" in host else host
        raise CannotListen(exc.errno, f"cannot listen on {shown}:{port}: {reason}") from None
    except BaseException:
        await runner.cleanup()
        raise
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return runner, int(address[1])
    return runner, port


async def wait_for_stop_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class RunningService:
    """An aiohttp service bound to host:port; closing it ends open requests too."""

    def __init__(self, runner: web.AppRunner, app: web.Application, host: str, port: int) -> None:
        self._runner = runner
        self.app = app
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

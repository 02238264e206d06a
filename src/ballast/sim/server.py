"""Running the simulator: in-process for tests (:func:`start_sim`) or blocking (:func:`run_sim`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from ballast.sim.app import create_app

logger = logging.getLogger(__name__)


class SimServer:
    """A running simulator bound to ``host:port``."""

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
        """Stop listening and drop open connections (hanging requests end too)."""
        await self._runner.cleanup()

    async def __aenter__(self) -> SimServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_sim(
    host: str = "127.0.0.1", port: int = 0, default: str = "ok", name: str = "sim"
) -> SimServer:
    """Start a simulator on ``host:port`` (port 0 picks a free port) and return it."""
    app = create_app(default, name=name)
    # shutdown_timeout bounds how long close() waits for hanging/stalled handlers.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound = int(address[1])
            break
    return SimServer(runner, app, host, bound)


def run_sim(
    host: str = "127.0.0.1", port: int = 8000, default: str = "ok", name: str = "sim"
) -> None:
    """Run a simulator until SIGINT or SIGTERM."""

    async def main() -> None:
        sim = await start_sim(host, port, default, name)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        logger.info("sim %r listening on %s (default behaviour %r)", name, sim.url, default)
        print(f"ballast sim {name!r} listening on {sim.url}", flush=True)
        try:
            await stop.wait()
        finally:
            await sim.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())

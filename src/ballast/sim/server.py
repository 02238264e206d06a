"""Running the simulator: in-process for tests (:func:`start_sim`) or blocking (:func:`run_sim`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ballast.server.aioweb import RunningService, start_site, wait_for_stop_signal
from ballast.sim.app import create_app

logger = logging.getLogger(__name__)


class SimServer(RunningService):
    """A running simulator bound to ``host:port``."""


async def start_sim(
    host: str = "127.0.0.1", port: int = 0, default: str = "ok", name: str = "sim"
) -> SimServer:
    """Start a simulator on ``host:port`` (port 0 picks a free port) and return it."""
    app = create_app(default, name=name)
    runner, bound = await start_site(app, host, port, shutdown_timeout=0.5)
    return SimServer(runner, app, host, bound)


def run_sim(
    host: str = "127.0.0.1", port: int = 8000, default: str = "ok", name: str = "sim"
) -> None:
    """Run a simulator until SIGINT or SIGTERM."""

    async def main() -> None:
        sim = await start_sim(host, port, default, name)
        logger.info("sim %r listening on %s (default behaviour %r)", name, sim.url, default)
        print(f"ballast sim {name!r} listening on {sim.url}", flush=True)
        try:
            await wait_for_stop_signal()
        finally:
            await sim.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())

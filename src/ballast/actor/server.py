"""Running the actor: in-process for tests (:func:`start_actor`) or blocking (:func:`run_actor`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ballast.actor.app import ACTOR, create_app
from ballast.actor.runs import RunRegistry
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.server.aioweb import RunningService, start_site, wait_for_stop_signal

logger = logging.getLogger(__name__)


class ActorServer(RunningService):
    """A running actor bound to ``host:port``; closing it ends open requests after a short
    grace, then the backend pool."""

    @property
    def registry(self) -> RunRegistry:
        return self.app[ACTOR].registry


async def start_actor(
    backend_url: str,
    host: str = "127.0.0.1",
    port: int = 0,
    idle_timeout: float = 900.0,
    jwt_ttl: float = 3600.0,
    *,
    control_secret: str,
    jwt_secret: str,
    clock: Clock = SYSTEM_CLOCK,
    sweep_interval: float | None = None,
    backend_api_key: str | None = None,
    shutdown_timeout: float = 2.0,
) -> ActorServer:
    """Start an actor in front of ``backend_url`` on ``host:port`` (0 picks a free port).

    Runs idle for longer than ``idle_timeout`` seconds are reclaimed; tokens live
    ``jwt_ttl`` seconds. ``sweep_interval`` defaults to ``min(idle_timeout / 4, 30)``.
    ``backend_api_key``, if given, is sent to the backend as its bearer token.
    """
    app = create_app(
        backend_url,
        control_secret=control_secret,
        jwt_secret=jwt_secret,
        idle_timeout=idle_timeout,
        jwt_ttl=jwt_ttl,
        clock=clock,
        sweep_interval=sweep_interval,
        backend_api_key=backend_api_key,
    )
    # handler_cancellation: a client that goes away ends its handler, and with it the
    # backend request and the run's in-flight mark.
    runner, bound = await start_site(
        app, host, port, shutdown_timeout=shutdown_timeout, handler_cancellation=True
    )
    return ActorServer(runner, app, host, bound)


def run_actor(
    backend_url: str,
    host: str = "127.0.0.1",
    port: int = 8100,
    idle_timeout: float = 900.0,
    jwt_ttl: float = 3600.0,
    *,
    control_secret: str,
    jwt_secret: str,
    sweep_interval: float | None = None,
    backend_api_key: str | None = None,
) -> None:
    """Run an actor until SIGINT or SIGTERM (open requests get a grace period)."""

    async def main() -> None:
        actor = await start_actor(
            backend_url,
            host,
            port,
            idle_timeout,
            jwt_ttl,
            control_secret=control_secret,
            jwt_secret=jwt_secret,
            sweep_interval=sweep_interval,
            backend_api_key=backend_api_key,
            shutdown_timeout=10.0,
        )
        backend = actor.app[ACTOR].backend_url
        logger.info(
            "actor listening on %s, backend %s, idle timeout %.0f s, token life %.0f s",
            actor.url, backend, idle_timeout, jwt_ttl,
        )  # fmt: skip
        print(f"ballast actor listening on {actor.url} (backend {backend})", flush=True)
        try:
            await wait_for_stop_signal()
        finally:
            await actor.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())

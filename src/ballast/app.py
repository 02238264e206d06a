"""Builds the ASGI app from settings and owns start-up and shutdown.

A request goes through, in order:
1. path dispatch (exact paths; no pattern matching on the hot path);
2. the OpenAI handler: bounded body read, `model`/`stream` extraction, model resolution;
3. the router's attempt loop (breakers, health, retries, failover, fallbacks);
4. the upstream exchange (pooled connection, stream clocks) and the relay to the client."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import orjson

from ballast.api.asgi import JSON, Receive, Scope, Send, send_bytes, send_error
from ballast.api.errors import ApiError
from ballast.api.openai import OpenAIHandlers
from ballast.clock import SYSTEM_CLOCK, Clock
from ballast.config import Settings
from ballast.routing.router import Router

log = logging.getLogger("ballast")

Route = Callable[[Scope, Receive, Send], Awaitable[None]]


class BallastApp:
    def __init__(
        self, settings: Settings, clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None
    ) -> None:
        self.settings = settings
        self.router = Router(settings, clock, rng)
        self.openai = OpenAIHandlers(self.router, settings.server.max_body_bytes)
        self.ready = False
        proxy = self.openai.proxy
        self._post: dict[str, Route] = {
            "/v1/chat/completions": lambda s, r, w: proxy(s, r, w, "/chat/completions"),
            "/v1/completions": lambda s, r, w: proxy(s, r, w, "/completions"),
            "/v1/embeddings": lambda s, r, w: proxy(s, r, w, "/embeddings"),
        }
        self._get: dict[str, Route] = {
            "/v1/models": self.openai.models,
            "/health": self._health,
            "/health/live": self._live,
            "/health/ready": self._health,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            method = scope["method"]
            routes = self._post if method == "POST" else self._get if method == "GET" else None
            route = routes.get(path) if routes is not None else None
            if route is not None:
                await route(scope, receive, send)
                return
            await self._not_found(scope, send, path)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _not_found(self, scope: Scope, send: Send, path: str) -> None:
        if path in self._post or path in self._get:
            error = ApiError(
                405,
                f"Method {scope['method']} is not allowed on {path}.",
                code="method_not_allowed",
            )
        else:
            error = ApiError(404, f"Unknown path {path[:200]}.", code="not_found")
        await send_error(send, error, [])

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200 if self.ready else 503
        body = orjson.dumps({"status": "ok" if self.ready else "starting"})
        await send_bytes(send, status, [JSON], body)

    async def _live(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, [JSON], b'{"status":"ok"}')

    async def startup(self) -> None:
        await self.router.start()
        self.ready = True

    async def shutdown(self) -> None:
        self.ready = False
        await self.router.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def app_from_env() -> BallastApp:
    """uvicorn's factory for `ballast serve` (each worker process builds its own app)."""
    import os

    from ballast.config import load_settings

    return BallastApp(load_settings(os.environ["BALLAST_CONFIG"]))

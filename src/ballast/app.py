"""Builds the ASGI app from settings and owns start-up and shutdown.

A request is dispatched on its exact path (no pattern matching on the hot path), shed with
503 past `server.max_in_flight`, and handed to its route on the configuration generation
now serving. The routes and the one list of stages they run are assembled in
api/routes.py, where that list is written out in order."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Awaitable, Callable

import orjson

from ballast.api.admin import Admin
from ballast.api.admin_ui import UI_FILES, ui_file
from ballast.api.admin_views import AdminViews
from ballast.api.fleet import Fleet
from ballast.api.jobs import JobsApi
from ballast.api.keys_admin import KeysAdmin
from ballast.api.messages import MESSAGES, MessagesShape
from ballast.api.models import MODELS_PREFIX
from ballast.api.reload import Generation, Reloader
from ballast.api.responses.shape import ResponsesShape
from ballast.cache.service import build_cache
from ballast.config import Settings, secret_values
from ballast.gc_tuning import settle_after_startup
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import JobStore
from ballast.mcp.gateway import MCP_PATH, McpGateway
from ballast.observe.hub import Observer
from ballast.observe.logs import hide
from ballast.pipeline.access import Access
from ballast.pipeline.asgi import JSON, Receive, Scope, Send, send_bytes, send_error
from ballast.pipeline.errors import ApiError
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.shape import Shape
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.routing.fleet_health import FleetHealth
from ballast.routing.router import Router
from ballast.routing.targets import Target
from ballast.state.hub import StateHub
from ballast.state.probes import ProbeLock
from ballast.state.sessions import SessionStore
from ballast.state.shared_handles import SharedHandles
from ballast.state.store import RedisStore
from ballast.state.upstream_health import SharedHealth

log = logging.getLogger("ballast")

Route = Callable[[Scope, Receive, Send], Awaitable[None]]

OVERLOADED = ApiError(
    503,
    "Ballast is at capacity right now; retry shortly.",
    "api_error",
    "overloaded",
    headers=((b"retry-after", b"1"),),
)


class BallastApp:
    def __init__(
        self, settings: Settings, clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.observer = Observer(
            lambda: self.router.targets.values(),
            clock,
            recent_requests=settings.observe.recent_requests,
        )
        self.state = StateHub(settings, clock)
        store = self.state.store
        self.fleet_health = _fleet_health(settings, store, clock, lambda: self.router.targets)
        self.router = Router(
            settings,
            clock,
            rng,
            on_event=self.observer.on_event,
            sessions=SessionStore(self.state.db),
            shared_handles=(
                (lambda dep_id: SharedHandles(store, dep_id, clock)) if store is not None else None
            ),
            probe_gate=_probe_lock(settings, store),
            fleet_health=self.fleet_health,
        )
        self.pipeline = Pipeline(settings, self.router, clock)
        self.responses = ResponsesShape(lambda model: self.generation.router.resolve(model), clock)
        self.messages = MessagesShape(lambda model: self.generation.router.resolve(model))
        self.ready = False
        self.in_flight = 0  # proxied requests running in this worker
        self.max_in_flight = settings.server.max_in_flight
        self.shed = 0  # requests refused with 503 because max_in_flight was reached
        self.config_path: str | None = None  # set when started from a file (enables reload)
        # A config reload swaps in a new generation; a request runs on the one it began on.
        self.generation = Generation(
            1, settings, self.pipeline, self.observer, self.responses, self.messages
        )
        self.reloader = Reloader(self)
        self.fleet = Fleet(self.state, settings.fleet, settings.state.redis_url)
        self.admin = Admin(self, self.reloader, self.fleet)
        KeysAdmin(
            self.state,
            settings.server.max_body_bytes,
            lambda model: self.generation.settings.serves(model),
        ).register(self.admin)
        AdminViews(self.admin, self.state).register()
        # Jobs: the dispatcher runs only when job backends are configured.
        self.job_store = JobStore(self.state.db, clock, settings.jobs.lease_time)
        self.dispatcher = (
            Dispatcher(settings.jobs, self.job_store, clock) if settings.jobs.backends else None
        )
        self.jobs = JobsApi(settings.jobs, self.job_store, self.dispatcher, clock)
        # `/mcp`, in front of the MCP tool servers; its spans go where the requests' go.
        self.mcp = McpGateway(settings, clock, self.observer, self.router.tracer)
        # Routes of shapes other than OpenAI's: their errors before the pipeline take that form.
        self._shapes: dict[str, Shape] = {
            "/v1/messages": MESSAGES,
            "/v1/messages/count_tokens": MESSAGES,
        }
        self._get: dict[str, Route] = {
            "/metrics": self.admin.metrics,
            "/dashboard": self.admin.dashboard,
            **dict.fromkeys(UI_FILES, ui_file),
            "/health": self._health,
            "/health/live": self._live,
            "/health/ready": self._health,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return
        path = scope["path"]
        method = scope["method"]
        if method == "POST":
            route = self.generation.post.get(path)
            if route is not None:
                # Overload protection: a counter check, no queue. Past the bound the client
                # is told at once to come back, instead of waiting behind others.
                if self.in_flight >= self.max_in_flight:
                    self.shed += 1
                    await self._overloaded(path, send)
                    return
                self.in_flight += 1
                try:
                    await route(scope, receive, send)
                finally:
                    self.in_flight -= 1
                return
        elif method == "GET":
            generation = self.generation
            found = generation.get.get(path)
            if found is not None:
                await found(scope, receive, send)
                return
            own = self._get.get(path)
            if own is not None:
                await own(scope, receive, send)
                return
            if path.startswith(MODELS_PREFIX):
                await generation.get[MODELS_PREFIX](scope, receive, send)
                return
        if path == MCP_PATH:
            await self._mcp(scope, receive, send)
            return
        if path.startswith("/admin/"):
            await self.admin.handle(scope, receive, send)
            return
        if path == "/v1/jobs" or path.startswith("/v1/jobs/"):
            await self.jobs.handle(scope, receive, send)
            return
        await self._not_found(scope, send, path)

    async def _mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`/mcp`, held to the same bound of requests at once as the other routes."""
        if self.in_flight >= self.max_in_flight:
            self.shed += 1
            await self.mcp.overloaded(send)
            return
        self.in_flight += 1
        try:
            await self.mcp(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _overloaded(self, path: str, send: Send) -> None:
        shape = self._shapes.get(path)
        if shape is None:
            await send_error(send, OVERLOADED, [])
            return
        status, body = shape.error(OVERLOADED)
        await send_bytes(send, status, [JSON, *OVERLOADED.headers], body)

    async def _not_found(self, scope: Scope, send: Send, path: str) -> None:
        generation = self.generation
        if path in generation.post or path in generation.get or path in self._get:
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
        hide(secret_values(self.settings))  # no log line shows a configured secret
        await self.state.start()
        await self.fleet.start()
        access = Access(
            self.settings,
            self.state.keys,
            self.state.limiter,
            self.state.spend,
            self.clock,
            self.state.budgets,
            self.state.teams,
        )
        await access.start()
        self.pipeline.access = access
        self.observer.budget_left = access.budget_left
        self.observer.cost_of_answer = access.pricing.cost
        self.jobs.access = access
        self.mcp.access = access
        await self.mcp.start()
        if self.dispatcher is not None:
            self.dispatcher.start()
        self.pipeline.cache = build_cache(self.settings, self.state.store, self.clock)
        await self.router.start()
        if self.fleet_health is not None:
            self.fleet_health.shared.start()  # reads the fleet's current verdicts first
        self.observer.metrics.deployments(self.router.targets.values())
        for deployment in access.unpriced_with_budgets:
            self.observer.metrics.unpriced.labels(deployment).set(1.0)
        self.observer.metrics.start()
        self.reloader.install_signal_handler()
        self.ready = True

    async def shutdown(self) -> None:
        self.ready = False
        await self.reloader.close()
        await self.fleet.close()
        if self.fleet_health is not None:
            await self.fleet_health.shared.close()
        await self.router.close()
        await self.mcp.close()
        if self.dispatcher is not None:
            await self.dispatcher.close()  # in-flight results written, leases handed back
        await self.state.close()
        await self.observer.metrics.close()

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
                settle_after_startup(self.settings.server.gc_young_threshold)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _probe_lock(settings: Settings, store: RedisStore | None) -> ProbeLock | None:
    """One background probe of a deployment at a time across the fleet, where Redis is."""
    return ProbeLock(store, settings.routing.breaker.probe_timeout) if store is not None else None


def _fleet_health(
    settings: Settings,
    store: RedisStore | None,
    clock: Clock,
    targets: Callable[[], dict[str, Target]],
) -> FleetHealth | None:
    """Upstream health shared through Redis, where there is one and it is not turned off."""
    url = settings.state.redis_url
    if store is None or url is None or not settings.fleet.share_health:
        return None
    shared = SharedHealth(store, url, clock, uuid.uuid4().hex[:16], settings.fleet.resubscribe)
    return FleetHealth(shared, clock, targets, settings.routing.breaker.probe_timeout)


def app_from_env() -> BallastApp:
    """uvicorn's factory for `ballast serve` (each worker process builds its own app)."""
    import os

    from ballast.config import load_settings
    from ballast.observe.logs import setup_logging
    from ballast.server.accept import GatewayLoop
    from ballast.server.protocol import GuardedHttpToolsProtocol

    setup_logging(
        os.environ.get("BALLAST_LOG_LEVEL", "info"), os.environ.get("BALLAST_LOG_FORMAT", "text")
    )
    settings = load_settings(os.environ["BALLAST_CONFIG"])
    app = BallastApp(settings)
    GuardedHttpToolsProtocol.configure(
        settings.server.header_timeout,
        settings.server.max_header_bytes,
        app.clock,
        settings.server.client_write_timeout,
    )
    GatewayLoop.accept_batch = settings.server.accept_batch
    app.config_path = os.environ["BALLAST_CONFIG"]
    return app

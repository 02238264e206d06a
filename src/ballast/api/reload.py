"""Config reload without dropping a request: the one home of config generations.

A reload builds a new router from the new file, starts it, and swaps it in as the next
*generation*; requests already running finish on the generation they started on, which is
closed once its last request is done, or after a grace on the app's clock. A config that
does not validate is refused with its errors and the running one keeps serving. The admin
API's `/admin/reload` and SIGHUP both come here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from typing import Any, Protocol

from ballast.api.routes import build_routes
from ballast.config import ConfigError, Settings, load_settings, secret_values
from ballast.gc_tuning import settle_after_retire
from ballast.mcp.gateway import McpGateway
from ballast.observe.hub import Observer
from ballast.observe.logs import hide, log_event
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.shape import Shape
from ballast.resilience.clock import Clock
from ballast.routing.router import Router
from ballast.state.hub import StateHub

log = logging.getLogger("ballast.admin")


class Gateway(Protocol):
    """What the admin API and a reload read and swap of the running gateway (the app,
    without importing it): its settings, the generation requests run on, and its counters."""

    settings: Settings
    clock: Clock
    generation: Generation
    observer: Observer
    router: Router
    pipeline: Pipeline
    mcp: McpGateway
    state: StateHub
    config_path: str | None
    ready: bool
    max_in_flight: int
    shed: int

    @property
    def responses(self) -> Shape: ...

    @property
    def messages(self) -> Shape: ...


class Generation:
    """One config's router and routes, with the client requests running on them."""

    __slots__ = (
        "_idle",
        "get",
        "in_flight",
        "number",
        "observer",
        "pipeline",
        "post",
        "router",
        "settings",
    )

    def __init__(
        self,
        number: int,
        settings: Settings,
        pipeline: Pipeline,
        observer: Observer,
        responses: Shape,
        messages: Shape,
    ) -> None:
        self.number = number
        self.settings = settings
        self.pipeline = pipeline
        self.router = pipeline.router
        self.observer = observer
        self.in_flight = 0
        self._idle: asyncio.Event | None = None
        self.post, self.get = build_routes(self, pipeline, observer, responses, messages)

    def left(self) -> None:
        """A request on this generation ended."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def retire(self, grace: float, clock: Clock) -> None:
        """Wait (at most `grace` seconds on `clock`) for the running requests, then close
        the router. The grace is a timer that wakes the same event the last request sets."""
        idle = self._idle = asyncio.Event()
        if self.in_flight == 0:
            idle.set()
        timer = clock.call_later(grace, idle.set)
        try:
            await idle.wait()
            if self.in_flight:
                log.warning(
                    "config generation %d: %d requests still running after %.0fs; closing it",
                    self.number,
                    self.in_flight,
                    grace,
                )
        finally:
            timer.cancel()
            await self.router.close()


class Reloader:
    """Loads the config again, swaps in a new generation and retires the old one. One reload
    at a time; the retiring generations are tasks awaited at shutdown."""

    def __init__(self, app: Gateway) -> None:
        self.app = app
        self.reloads = 0
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def retiring(self) -> int:
        """Generations (and SIGHUP reloads) still running in the background."""
        return len(self._retiring)

    async def reload(self) -> list[str]:
        """Load the config file again and swap it in; the errors when it is refused."""
        app = self.app
        metrics = app.observer.metrics
        async with self._lock:
            if app.config_path is None:
                return ["(reload): this gateway was not started from a config file"]
            try:
                settings = await asyncio.to_thread(load_settings, app.config_path)
            except ConfigError as exc:
                metrics.reloads.labels("refused").inc()
                log.warning("config reload refused: %d problem(s)", len(exc.errors))
                return exc.errors
            try:
                await self.swap(settings)
            except Exception as exc:
                metrics.reloads.labels("failed").inc()
                log.exception("config reload failed")
                return [f"(start): the new config could not start ({type(exc).__name__})"]
            metrics.reloads.labels("ok").inc()
            return []

    async def swap(self, settings: Settings) -> None:
        """Start a router for `settings` and make it the one new requests use."""
        app = self.app
        old = app.generation
        router = Router(
            settings,
            old.router.clock,
            old.router.rng,
            on_event=app.observer.on_event,
            sessions=old.router.sessions,
            shared_handles=old.router.shared_handles,
            probe_gate=old.router.probe_gate,
            fleet_health=old.router.fleet_health,
        )
        for previous in old.router.targets.values():
            router.deployments.adopt(previous)  # an unchanged deployment keeps its state
        try:
            await router.start()
        except BaseException:
            await router.close()
            raise
        try:
            gone = await app.mcp.reconfigure(settings)
        except BaseException:
            await router.close()
            raise
        pipeline = Pipeline(settings, router, app.clock)
        pipeline.access = old.pipeline.access  # what start-up attached
        pipeline.cache = old.pipeline.cache
        new = Generation(
            old.number + 1, settings, pipeline, app.observer, app.responses, app.messages
        )
        # The swap itself: no await between these lines, so no request sees half of it.
        app.generation = new
        app.settings = settings
        app.router = router
        app.pipeline = pipeline
        if pipeline.access is not None:
            pipeline.access.use_master_key(settings)  # the old master key stops here
        hide(secret_values(settings))
        self.reloads += 1
        app.observer.metrics.deployments(router.targets.values())
        app.observer.note(
            "reload",
            {"generation": new.number, "deployments": len(router.targets)},
        )
        grace = old.settings.timeouts.request + 5.0
        task = self._background(old.retire(grace, app.clock))
        task.add_done_callback(lambda _: settle_after_retire())
        if gone:
            self._background(app.mcp.retire(gone, grace))

    async def close(self) -> None:
        """At shutdown: let retiring generations finish (they hold open connections)."""
        for task in list(self._retiring):
            task.cancel()
        for task in list(self._retiring):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def install_signal_handler(self) -> None:
        """SIGHUP reloads the config file (only in the main thread, where signals arrive)."""
        if self.app.config_path is None or not hasattr(signal, "SIGHUP"):
            return
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading the config")

        async def run() -> None:
            errors = await self.reload()
            for line in errors:
                log.error("config reload refused: %s", line)
            detail = {"refused": len(errors)} if errors else None
            await record_action(self.app, "signal", "reload", None, detail)

        self._background(run())

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task kept until it ends, and awaited by `close`."""
        task = asyncio.get_running_loop().create_task(work)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task


async def record_action(
    app: Gateway, actor: str, action: str, target: str | None, detail: dict[str, Any] | None
) -> None:
    """An admin action done: one line in the event log and one row in the audit table (who:
    the master key, a token, the CLI or a signal; what; when). `detail` holds the fields
    set, never a secret. A database that cannot take the row does not undo the action: the
    log line still says it."""
    fields = {"actor": actor, "action": action, "target": target, "detail": detail or {}}
    log_event("admin", fields)
    audit = getattr(getattr(app, "state", None), "audit", None)
    if audit is None:
        return
    try:
        await audit.append(app.clock.time(), actor, action, target, detail or {})
    except Exception as exc:  # the database is down: the log line above stands
        log.warning("admin action %s not written to the audit table: %s", action, exc)

"""The operator's surface: `/admin/*` (master key), `/metrics` and `/dashboard` (master key or
the read-only dashboard token). `/admin/reload` hands over to the reloader (reload.py), which
owns config generations."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson

from ballast.api.admin_auth import ACTOR, SECURITY_HEADERS, authorize, unframed
from ballast.api.fleet import Fleet
from ballast.api.reload import Gateway, Reloader, record_action
from ballast.config import masked
from ballast.observe.metrics import CONTENT_TYPE
from ballast.observe.request_stats import (
    CACHED,
    COST,
    INPUT,
    OUTPUT,
    REASONING,
    REQUESTS,
    WRITTEN,
    WRITTEN_1H,
)
from ballast.pipeline.asgi import (
    JSON,
    Receive,
    Scope,
    Send,
    require_json,
    send_bytes,
    send_error,
)
from ballast.pipeline.errors import ApiError
from ballast.resilience.lockout import Lockout

log = logging.getLogger("ballast.admin")

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

NOT_CONFIGURED = {"status": "not configured"}
# The dashboard's usage fields and the usage row's column each is read from.
_USAGE_FIELDS = (
    ("requests", REQUESTS),
    ("input_tokens", INPUT),
    ("output_tokens", OUTPUT),
    ("cached_tokens", CACHED),
    ("cache_write_tokens", WRITTEN),
    ("cache_write_1h_tokens", WRITTEN_1H),
    ("reasoning_tokens", REASONING),
)


def process_stats() -> dict[str, Any]:
    """This worker's footprint, for soak tests and operators: resident memory, open file
    descriptors and live asyncio tasks (all flat over time when nothing leaks)."""
    stats: dict[str, Any] = {"tasks": len(asyncio.all_tasks())}
    try:
        stats["open_fds"] = len(os.listdir("/proc/self/fd"))
        with open("/proc/self/statm") as statm:
            stats["rss_bytes"] = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        pass
    return stats


class Admin:
    def __init__(self, app: Gateway, reloader: Reloader, fleet: Fleet | None = None) -> None:
        self.app = app
        self.reloader = reloader
        self.fleet = fleet
        self.started = app.clock.time()
        server = app.settings.server
        self.lockout = Lockout(server.admin_failure_limit, server.admin_lockout, app.clock)
        if fleet is not None:
            self._join(fleet)
        self._routes: dict[tuple[str, str], tuple[Handler, bool]] = {
            ("GET", "/admin/state"): (self.state, False),
            ("GET", "/admin/events"): (self.events, False),
            ("GET", "/admin/config"): (self.config, True),
            ("POST", "/admin/reload"): (self.reload, True),
        }

    def _join(self, fleet: Fleet) -> None:
        """What this worker does when an admin action reaches it from elsewhere."""

        async def drain(args: dict[str, Any]) -> None:
            self._set_drained(str(args.get("deployment")), True)

        async def enable(args: dict[str, Any]) -> None:
            self._set_drained(str(args.get("deployment")), False)

        async def reload(args: dict[str, Any]) -> None:
            for line in await self.reloader.reload():
                log.error("config reload (sent by another worker) refused: %s", line)

        async def key(args: dict[str, Any]) -> None:
            fleet.hub.keys.forget(str(args.get("key_id")))

        async def key_changed(key_id: str) -> None:
            await fleet.announce("key", {"key_id": key_id}, apply_here=False)

        fleet.handlers.update(drain=drain, enable=enable, reload=reload, key=key)
        fleet.hub.keys.listeners.append(key_changed)
        fleet.summary = self.summary

    def summary(self) -> dict[str, Any]:
        """This worker in a line of the fleet view."""
        app = self.app
        generation = app.generation
        targets = generation.router.targets.values()
        fleet = self.fleet
        fleet_health = getattr(app, "fleet_health", None)
        return {
            "worker": fleet.worker if fleet is not None else str(os.getpid()),
            "instance": fleet.instance if fleet is not None else "",
            "pid": os.getpid(),
            "ready": app.ready,
            "generation": generation.number,
            "reloads": self.reloader.reloads,
            "in_flight": generation.in_flight,
            "shed": app.shed,
            "commands_applied": fleet.applied if fleet is not None else 0,
            "drained": sorted(t.id for t in targets if t.drained),
            "breakers": {t.id: t.breaker.state.value for t in targets},
            "health_shared": fleet_health is not None and fleet_health.shared.connected,
            "models": [g.name for g in generation.settings.models],
            "rss_bytes": process_stats().get("rss_bytes"),
            "db_statements": app.state.db.statements,
        }

    def add(self, method: str, path: str, handler: Handler, write: bool = True) -> None:
        """Register another exact `/admin/...` route behind the same key check."""
        self._routes[(method, path)] = (handler, write)

    # -- auth -------------------------------------------------------------------------

    def authorize(self, scope: Scope, write: bool) -> str:
        """Which admin credential the request gave (admin_auth.authorize)."""
        return authorize(scope, write, self.app.settings.server, self.lockout)

    # -- dispatch ---------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Everything under /admin/."""
        path: str = scope["path"]
        method: str = scope["method"]
        send = unframed(send)
        try:
            found = self._routes.get((method, path))
            if found is not None:
                handler, write = found
                scope[ACTOR] = self.authorize(scope, write)
                if method == "POST":
                    require_json(scope)  # a form cannot create a key or reload the config
                await handler(scope, receive, send)
                return
            parts = path.split("/")
            # /admin/deployments/{id}/drain|enable
            if len(parts) == 5 and parts[2] == "deployments" and parts[4] in ("drain", "enable"):
                if method != "POST":
                    raise ApiError(405, f"Method {method} is not allowed on {path[:200]}.")
                scope[ACTOR] = self.authorize(scope, True)
                require_json(scope)
                await self.set_drained(scope, send, parts[3], parts[4] == "drain")
                return
            if any(p == path for _, p in self._routes):
                raise ApiError(405, f"Method {method} is not allowed on {path[:200]}.")
            raise ApiError(404, f"Unknown path {path[:200]}.", code="not_found")
        except ApiError as error:
            await send_error(send, error, [])

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.app.observer.metrics.render()
        await send_bytes(send, 200, [(b"content-type", CONTENT_TYPE)], body)

    async def dashboard(self, scope: Scope, receive: Receive, send: Send) -> None:
        from ballast.api.dashboard import page

        try:
            self.authorize(scope, False)
        except ApiError as error:
            await send_error(unframed(send), error, [])
            return
        headers = [(b"content-type", b"text/html; charset=utf-8"), *SECURITY_HEADERS]
        await send_bytes(send, 200, headers, page())

    # -- read -------------------------------------------------------------------------

    async def state(self, scope: Scope, receive: Receive, send: Send) -> None:
        """This worker in detail, and under `fleet` every worker of every instance."""
        snapshot = self.snapshot()
        if self.fleet is not None:
            snapshot["fleet"] = await self.fleet.view()
        await send_bytes(send, 200, [JSON], orjson.dumps(snapshot))

    def snapshot(self) -> dict[str, Any]:
        app = self.app
        generation = app.generation
        router = generation.router
        traffic = app.observer.traffic
        models = []
        for group in router.settings.models:
            deployments = []
            for dep in group.deployments:
                target = router.targets.get(dep.id)
                if target is None:
                    continue
                health = target.health.snapshot()
                breaker = target.breaker.snapshot()
                handles = None
                cache = target.adapter.handles
                if cache is not None:
                    stats = cache.stats
                    handles = {
                        "size": len(cache),
                        "created": stats.created,
                        "refreshed": stats.refreshed,
                        "healed": stats.healed,
                        "failed": stats.failed,
                    }
                deployments.append(
                    {
                        "id": dep.id,
                        "provider": dep.provider,
                        "model": dep.model,
                        "weight": dep.weight,
                        "drained": target.drained,
                        "score": round(100.0 * (1.0 - health["error_rate"]), 1),
                        "in_flight": health["in_flight"],
                        "cooldown": breaker["retry_after"],
                        "breaker": breaker,
                        "health": health,
                        "handles": handles,
                        "traffic": traffic.series(dep.id),
                    }
                )
            models.append(
                {
                    "name": group.name,
                    "strategy": group.strategy,
                    "fallbacks": group.fallbacks,
                    "deployments": deployments,
                }
            )
        last = app.observer.events[-1]["seq"] if app.observer.events else 0
        now = app.clock.time()
        return {
            "time": now,
            "pid": os.getpid(),
            "uptime": now - self.started,
            "ready": app.ready,
            "generation": generation.number,
            "reloads": self.reloader.reloads,
            "in_flight": generation.in_flight,
            "max_in_flight": app.max_in_flight,
            "shed": app.shed,
            "process": process_stats(),
            "retiring_generations": self.reloader.retiring,
            "traffic_bucket_seconds": traffic.BUCKET,
            "models": models,
            "redis": self._backend("redis"),
            "database": self._backend("database"),
            "jobs": {"status": "no jobs backend configured"},
            "mcp": app.mcp.snapshot(),
            "last_event": last,
            "usage": self.usage(),
            "failures": list(reversed(app.observer.failures))[:20],
        }

    def usage(self) -> dict[str, Any]:
        """Tokens and dollars since start by key and by model (every worker's, where the
        workers share their counters), with each key's budget left as last seen."""
        metrics = self.app.observer.metrics
        stats = metrics.snapshots.merged() if metrics.snapshots is not None else metrics.stats
        by_key: dict[str, list[float]] = {}
        by_model: dict[str, list[float]] = {}
        for (model, _dep, _provider, _shape, key_id), row in stats.usage.items():
            for table, name in ((by_key, key_id), (by_model, model)):
                total = table.setdefault(name, [0] * len(row))
                for i, amount in enumerate(row):
                    total[i] += amount

        def rows(table: dict[str, list[float]], label: str) -> list[dict[str, Any]]:
            out = []
            for name, row in sorted(table.items()):
                line: dict[str, Any] = {label: name}
                for field, column in _USAGE_FIELDS:
                    line[field] = int(row[column])
                line["cost"] = row[COST]
                if label == "key_id":
                    line["budget_left"] = stats.budget.get(name)
                out.append(line)
            return out

        total_cost = sum(row[COST] for row in by_model.values())
        return {
            "by_key": rows(by_key, "key_id"),
            "by_model": rows(by_model, "model"),
            "cost": total_cost,
        }

    def _backend(self, name: str) -> dict[str, Any]:
        """A state backend's status (`redis`, `database`) from the app's state hub, with a
        `status` line for people: "not configured", "ok", or the breaker's state."""
        hub = getattr(self.app, "state", None)
        probe = getattr(hub, "status", None)
        found = probe().get(name) if callable(probe) else None
        if not isinstance(found, dict) or found.get("configured") is False:
            return dict(NOT_CONFIGURED)
        status: dict[str, Any] = dict(found)
        if "status" not in status:
            state = status.get("state")
            status["status"] = "ok" if state in (None, "closed") else f"degraded ({state})"
        return status

    async def events(self, scope: Scope, receive: Receive, send: Send) -> None:
        since = 0
        query = scope.get("query_string") or b""
        if query:
            given = parse_qs(query.decode("latin-1")).get("since")
            if given and given[0].isdigit():
                since = int(given[0])
        events = self.app.observer.recent(since)
        await send_bytes(send, 200, [JSON], orjson.dumps({"events": events}))

    async def config(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, [JSON], orjson.dumps(masked(self.app.settings)))

    # -- write ------------------------------------------------------------------------

    async def audit(
        self, scope: Scope, action: str, target: str | None, detail: dict[str, Any] | None = None
    ) -> None:
        """An admin action done, by the credential the request gave (reload.record_action)."""
        await record_action(self.app, str(scope.get(ACTOR, "unknown")), action, target, detail)

    async def set_drained(self, scope: Scope, send: Send, dep_id: str, drained: bool) -> None:
        target = self.app.generation.router.targets.get(dep_id)
        if target is None:
            raise ApiError(404, f"Unknown deployment {dep_id[:200]!r}.", code="not_found")
        await self.audit(scope, "deployment.drain" if drained else "deployment.enable", dep_id)
        body: dict[str, Any] = {"id": dep_id, "drained": drained}
        if self.fleet is not None:
            action = "drain" if drained else "enable"
            body["fleet"] = await self.fleet.announce(action, {"deployment": dep_id})
        else:
            self._set_drained(dep_id, drained)
        fleet_health = getattr(self.app, "fleet_health", None)
        if fleet_health is not None:
            fleet_health.drained(dep_id, drained)  # for the instances that start later
        body["breaker"] = target.breaker.state.value
        await send_bytes(send, 200, [JSON], orjson.dumps(body))

    def _set_drained(self, dep_id: str, drained: bool) -> None:
        target = self.app.generation.router.targets.get(dep_id)
        if target is not None and target.drained != drained:
            target.drained = drained
            self.app.observer.note(
                "drain" if drained else "enable", {"deployment": dep_id, "by": "admin"}
            )

    async def reload(self, scope: Scope, receive: Receive, send: Send) -> None:
        errors = await self.reloader.reload()
        await self.audit(scope, "reload", None, {"refused": len(errors)} if errors else None)
        if errors:
            body = {
                "error": {
                    "message": "The new config was refused; the running one keeps serving.\n"
                    + "\n".join(errors),
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_config",
                },
                "errors": errors,
            }
            await send_bytes(send, 400, [JSON], orjson.dumps(body))
            return
        done: dict[str, Any] = {"status": "reloaded", "generation": self.app.generation.number}
        if self.fleet is not None:  # every other worker and instance reads its own file
            done["fleet"] = await self.fleet.announce("reload", {}, apply_here=False)
        await send_bytes(send, 200, [JSON], orjson.dumps(done))

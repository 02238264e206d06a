"""What the admin UI reads beyond keys and teams (api/keys_admin.py): who signed in, the
models with their deployments, prices and health, spend over time from `spend_events`,
the recent requests' metadata and the audit log. Every route reads; the dashboard token may
call them all. The shapes are in docs/admin-api.md."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import orjson
from sqlalchemy.exc import SQLAlchemyError

from ballast.api.admin import Admin
from ballast.api.admin_auth import ACTOR, MASTER_KEY
from ballast.pipeline.asgi import JSON, Receive, Scope, Send, send_bytes
from ballast.pipeline.errors import ApiError, bad_request
from ballast.state.hub import StateHub
from ballast.state.prices import PriceBook
from ballast.state.spend_report import BUCKETS, GROUPS

MAX_BUCKETS = 2000  # a chart's points per series: 83 days by the hour
DEFAULT_SPAN = {"hour": 48 * 3600, "day": 30 * 86_400}
MAX_ROWS = 1000


def _query(scope: Scope) -> dict[str, str]:
    parsed = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    return {name: values[0] for name, values in parsed.items() if values}


def _number(given: dict[str, str], name: str, default: float) -> float:
    text = given.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise bad_request(f"'{name}' must be a number.", name) from None
    if not 0 <= value <= 253_402_300_799:
        raise bad_request(f"'{name}' must be a time in seconds since 1970.", name)
    return value


def _count(given: dict[str, str], name: str, default: int) -> int:
    text = given.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_ROWS:
        raise bad_request(f"'{name}' must be an integer from 1 to {MAX_ROWS}.", name)
    return int(text)


def _seq(given: dict[str, str], name: str) -> int | None:
    text = given.get(name)
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise bad_request(f"'{name}' must be a sequence number.", name)
    return int(text)


def _json(body: Any) -> bytes:
    return orjson.dumps(body)


def _unavailable(what: str) -> ApiError:
    return ApiError(
        503, f"{what} cannot be read right now; retry shortly.", "api_error", "unavailable"
    )


class AdminViews:
    def __init__(self, admin: Admin, hub: StateHub) -> None:
        self.admin = admin
        self.hub = hub

    def register(self) -> None:
        add = self.admin.add
        add("GET", "/admin/whoami", self.whoami, write=False)
        add("GET", "/admin/models", self.models, write=False)
        add("GET", "/admin/spend", self.spend, write=False)
        add("GET", "/admin/requests", self.requests, write=False)
        add("GET", "/admin/audit", self.audit, write=False)

    async def whoami(self, scope: Scope, receive: Receive, send: Send) -> None:
        actor = scope.get(ACTOR)
        body = {"actor": actor, "can_write": actor == MASTER_KEY}
        await send_bytes(send, 200, [JSON], _json(body))

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every model group with its deployments: provider, model, price per million
        tokens, breaker, health over the window, drained or not."""
        app = self.admin.app
        router = app.generation.router
        settings = router.settings
        access = app.pipeline.access
        prices = (
            access.pricing.prices
            if access is not None
            else PriceBook(settings.prices, settings.budgets.built_in_prices)
        )
        groups = []
        for group in settings.models:
            deployments = []
            for dep in group.deployments:
                target = router.targets.get(dep.id)
                price = prices.get(dep.model or group.name)
                line: dict[str, Any] = {
                    "id": dep.id,
                    "provider": dep.provider,
                    "model": dep.model,
                    "weight": dep.weight,
                    "price": (
                        {"input": price.input, "output": price.output}
                        if price is not None
                        else None
                    ),
                }
                if target is not None:
                    health = target.health.snapshot()
                    line.update(
                        drained=target.drained,
                        breaker=target.breaker.state.value,
                        calls=health["calls"],
                        error_rate=health["error_rate"],
                        latency=health["latency"],
                        ttft=health["ttft"],
                        in_flight=health["in_flight"],
                    )
                deployments.append(line)
            groups.append(
                {
                    "name": group.name,
                    "strategy": group.strategy,
                    "fallbacks": group.fallbacks,
                    "deployments": deployments,
                }
            )
        await send_bytes(send, 200, [JSON], _json({"object": "list", "data": groups}))

    async def spend(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`?by=key|team|model&bucket=hour|day&since=&until=` (seconds since 1970)."""
        given = _query(scope)
        by = given.get("by", "key")
        if by not in GROUPS:
            raise bad_request("'by' must be key, team or model.", "by")
        bucket = given.get("bucket", "hour")
        if bucket not in BUCKETS:
            raise bad_request("'bucket' must be hour or day.", "bucket")
        now = self.hub.clock.time()
        until = _number(given, "until", now)
        since = _number(given, "since", until - DEFAULT_SPAN[bucket])
        if since >= until:
            raise bad_request("'since' must be before 'until'.", "since")
        if (until - since) / BUCKETS[bucket] > MAX_BUCKETS:
            raise bad_request(
                f"At most {MAX_BUCKETS} buckets of a {bucket}: ask for a shorter span.", "since"
            )
        try:
            series = await self.hub.spend_report.series(by, bucket, since, until)
        except (SQLAlchemyError, OSError):
            raise _unavailable("Spend") from None
        body = {
            "by": by,
            "bucket": bucket,
            "bucket_seconds": BUCKETS[bucket],
            "since": since,
            "until": until,
            "data": [s.public() for s in series],
        }
        await send_bytes(send, 200, [JSON], _json(body))

    async def requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        """This worker's last requests, newest first: metadata only, never a body."""
        limit = _count(_query(scope), "limit", 100)
        rows = self.admin.app.observer.recent_requests(limit)
        await send_bytes(send, 200, [JSON], _json({"object": "list", "data": rows}))

    async def audit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The audit log, newest first; `?before=<seq>` pages back."""
        given = _query(scope)
        limit = _count(given, "limit", 100)
        try:
            entries = await self.hub.audit.recent(limit, _seq(given, "before"))
        except (SQLAlchemyError, OSError):
            raise _unavailable("The audit log") from None
        body = {"object": "list", "data": [e.public() for e in entries]}
        await send_bytes(send, 200, [JSON], _json(body))

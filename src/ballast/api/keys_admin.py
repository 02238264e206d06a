"""`/admin/keys`: create, list and revoke virtual keys, and read a key's spend (master key)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from ballast.pipeline.asgi import JSON, Receive, Scope, Send, read_body, send_bytes
from ballast.pipeline.errors import ApiError, bad_request
from ballast.state.hub import StateHub
from ballast.state.spend import period_of

if TYPE_CHECKING:
    from ballast.api.admin import Admin

_INT_FIELDS = ("rpm", "tpm", "max_parallel", "max_concurrent_jobs")


def key_options(data: dict[str, Any]) -> dict[str, Any]:
    """Validated attributes for a new key; a 400 names the first bad one."""
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad_request("'name' is required.", "name")
    options: dict[str, Any] = {"name": name.strip()[:200]}
    models = data.get("models")
    if models is not None:
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise bad_request("'models' must be a list of model names.", "models")
        options["models"] = models
    for field in _INT_FIELDS:
        value = data.get(field)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad_request(f"'{field}' must be a positive integer.", field)
            options[field] = value
    for field in ("budget", "expires_at"):
        value = data.get(field)
        if value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise bad_request(f"'{field}' must be a non-negative number.", field)
            options[field] = float(value)
    period = data.get("budget_period", "month")
    if period not in ("day", "month", "total"):
        raise bad_request("'budget_period' must be day, month or total.", "budget_period")
    options["budget_period"] = period
    return options


class KeysAdmin:
    def __init__(self, hub: StateHub, max_body_bytes: int) -> None:
        self.hub = hub
        self.max_body_bytes = max_body_bytes

    def register(self, admin: Admin) -> None:
        admin.add("GET", "/admin/keys", self.list_keys, write=True)
        admin.add("POST", "/admin/keys", self.create, write=True)
        admin.add("POST", "/admin/keys/revoke", self.revoke, write=True)
        admin.add("GET", "/admin/keys/spend", self.spend, write=True)

    async def _json(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        body = await read_body(scope, receive, self.max_body_bytes)
        try:
            data = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError:
            raise bad_request("We could not parse the JSON body of your request.") from None
        if not isinstance(data, dict):
            raise bad_request("The request body must be a JSON object.")
        return data

    async def list_keys(self, scope: Scope, receive: Receive, send: Send) -> None:
        records = await self.hub.keys.list()
        body = orjson.dumps({"object": "list", "data": [r.public() for r in records]})
        await send_bytes(send, 200, [JSON], body)

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        options = key_options(await self._json(scope, receive))
        plaintext, record = await self.hub.keys.create(**options)
        body = orjson.dumps({"key": plaintext, **record.public()})
        await send_bytes(send, 201, [JSON], body)

    async def revoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        key_id = (await self._json(scope, receive)).get("id")
        if not isinstance(key_id, str):
            raise bad_request("'id' is required.", "id")
        if not await self.hub.keys.revoke(key_id):
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        await send_bytes(send, 200, [JSON], orjson.dumps({"id": key_id, "revoked": True}))

    async def spend(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        key_id = (query.get("id") or [""])[0]
        record = await self.hub.keys.get(key_id) if key_id else None
        if record is None:
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        period = (query.get("period") or [period_of(record.budget_period, self.hub.clock.time())])[
            0
        ]
        total = await self.hub.spend.key_spend(record.id, period)
        body = orjson.dumps(
            {"id": record.id, "period": period, "spend": total, "budget": record.budget}
        )
        await send_bytes(send, 200, [JSON], body)

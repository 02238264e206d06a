"""`/admin/keys`: create, list and revoke virtual keys, and read a key's spend (master key)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from ballast.pipeline.asgi import JSON, Receive, Scope, Send, read_body, send_bytes
from ballast.pipeline.errors import ApiError, bad_request
from ballast.state.hub import StateHub
from ballast.state.spend import SpendUnavailable, period_of

if TYPE_CHECKING:
    from ballast.api.admin import Admin

_INT_FIELDS = ("rpm", "tpm", "max_parallel", "max_concurrent_jobs")
MAX_INT = 2**31 - 1  # the INTEGER columns: PostgreSQL's int4 is the narrowest
MAX_BUDGET = 1e12  # dollars; also keeps sums of spend far from float trouble
MAX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z
MAX_NAME = 200  # the name and model columns
MAX_MODELS = 1000


def text_field(value: Any, field: str, max_length: int = MAX_NAME) -> str:
    """A string the database can store (no NUL, bounded), or a 400 naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{field}' must be a non-empty string.", field)
    if "\x00" in value:
        raise bad_request(f"'{field}' must not contain a NUL character.", field)
    if len(value) > max_length:
        raise bad_request(f"'{field}' must be at most {max_length} characters.", field)
    return value


def key_options(data: dict[str, Any]) -> dict[str, Any]:
    """Validated attributes for a new key; a 400 names the first bad one."""
    options: dict[str, Any] = {"name": text_field(data.get("name"), "name").strip()}
    models = data.get("models")
    if models is not None:
        if not isinstance(models, list) or len(models) > MAX_MODELS:
            raise bad_request(
                f"'models' must be a list of at most {MAX_MODELS} model names.", "models"
            )
        options["models"] = [text_field(m, "models") for m in models]
    for field in _INT_FIELDS:
        value = data.get(field)
        if value is not None:
            if type(value) is not int or not 1 <= value <= MAX_INT:  # bool is not a count
                raise bad_request(f"'{field}' must be an integer from 1 to {MAX_INT}.", field)
            options[field] = value
    for field, highest in (("budget", MAX_BUDGET), ("expires_at", MAX_TIME)):
        value = data.get(field)
        if value is not None:
            if (
                type(value) not in (int, float)
                or not math.isfinite(value)
                or not 0 <= value <= highest
            ):
                raise bad_request(f"'{field}' must be a number from 0 to {highest:.0f}.", field)
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
        key_id = text_field((await self._json(scope, receive)).get("id"), "id")
        if not await self.hub.keys.revoke(key_id):
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        await send_bytes(send, 200, [JSON], orjson.dumps({"id": key_id, "revoked": True}))

    async def spend(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        key_id = text_field((query.get("id") or [""])[0], "id")
        record = await self.hub.keys.get(key_id)
        if record is None:
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        given = query.get("period")
        period = (
            text_field(given[0], "period", 10)
            if given
            else period_of(record.budget_period, self.hub.clock.time())
        )
        try:
            total = await self.hub.spend.key_spend(record.id, period)
        except SpendUnavailable:
            raise ApiError(
                503, "Spend cannot be read right now; retry shortly.", "api_error", "unavailable"
            ) from None
        body = orjson.dumps(
            {"id": record.id, "period": period, "spend": total, "budget": record.budget}
        )
        await send_bytes(send, 200, [JSON], body)

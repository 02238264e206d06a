"""`/admin/keys` and `/admin/teams` (master key): create, update, rotate, list (with limits
and spend) and revoke virtual keys; teams of keys sharing a budget and limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from ballast.api.key_fields import (
    MAX_TIME,
    TEAM_FIELDS,
    key_changes,
    key_options,
    team_options,
    text_field,
)
from ballast.pipeline.asgi import JSON, Receive, Scope, Send, read_body, send_bytes
from ballast.pipeline.errors import ApiError, bad_request
from ballast.state.hub import StateHub
from ballast.state.spend import SpendUnavailable, period_of

if TYPE_CHECKING:
    from ballast.api.admin import Admin


class KeysAdmin:
    """The dashboard token reads keys and teams (never a key's value: only its id, name and
    limits are stored in the clear); only the master key changes them, and every change is
    in the audit log."""

    def __init__(
        self, hub: StateHub, max_body_bytes: int, serves: Callable[[str], bool] | None = None
    ) -> None:
        self.hub = hub
        self.max_body_bytes = max_body_bytes
        self.serves = serves  # whether the config now serving has a model: a key may name it
        self.admin: Admin | None = None

    def register(self, admin: Admin) -> None:
        self.admin = admin
        admin.add("GET", "/admin/keys", self.list_keys, write=False)
        admin.add("POST", "/admin/keys", self.create, write=True)
        admin.add("POST", "/admin/keys/revoke", self.revoke, write=True)
        admin.add("GET", "/admin/keys/spend", self.spend, write=False)
        admin.add("POST", "/admin/keys/update", self.update, write=True)
        admin.add("POST", "/admin/keys/rotate", self.rotate, write=True)
        admin.add("GET", "/admin/teams", self.list_teams, write=False)
        admin.add("POST", "/admin/teams", self.create_team, write=True)
        admin.add("POST", "/admin/teams/update", self.update_team, write=True)

    async def _audit(
        self, scope: Scope, action: str, target: str, detail: dict[str, Any] | None = None
    ) -> None:
        if self.admin is not None:
            await self.admin.audit(scope, action, target, detail)

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
        """Every key with its limits and its spend in the current budget period."""
        now = self.hub.clock.time()
        data = []
        for record in await self.hub.keys.list():
            period = period_of(record.budget_period, now)
            data.append(
                {**record.public(), "period": period, "spend": await self._spent(record.id, period)}
            )
        await send_bytes(send, 200, [JSON], orjson.dumps({"object": "list", "data": data}))

    async def _spent(self, key_id: str, period: str) -> float | None:
        try:
            return await self.hub.spend.key_spend(key_id, period)
        except SpendUnavailable:
            return None

    async def _check_team(self, options: dict[str, Any]) -> None:
        team_id = options.get("team_id")
        if team_id is not None and await self.hub.teams.get(team_id) is None:
            raise bad_request(f"No team with id {team_id[:80]}.", "team_id")

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        options = key_options(await self._json(scope, receive), self.serves)
        await self._check_team(options)
        plaintext, record = await self.hub.keys.create(**options)
        await self._audit(scope, "key.create", record.id, options)
        body = orjson.dumps({"key": plaintext, **record.public()})
        await send_bytes(send, 201, [JSON], body)

    async def revoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        key_id = text_field((await self._json(scope, receive)).get("id"), "id")
        if not await self.hub.keys.revoke(key_id):
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        await self._audit(scope, "key.revoke", key_id)
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

    async def update(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Change a key's limits, budget, models, expiry or team: the fields given only."""
        data = await self._json(scope, receive)
        key_id = text_field(data.get("id"), "id")
        changes = key_changes(data, serves=self.serves)
        await self._check_team(changes)
        record = await self.hub.keys.update(key_id, changes)
        if record is None:
            raise ApiError(404, f"No key with id {key_id[:80]}.", code="key_not_found")
        await self._audit(scope, "key.update", key_id, changes)
        await send_bytes(send, 200, [JSON], orjson.dumps(record.public()))

    async def rotate(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A new value for a key; the old one keeps working for `grace_seconds`."""
        data = await self._json(scope, receive)
        key_id = text_field(data.get("id"), "id")
        grace = data.get("grace_seconds", 0)
        if type(grace) not in (int, float) or not 0 <= grace <= MAX_TIME / 100:
            raise bad_request(
                "'grace_seconds' must be a number of seconds, 0 or more.", "grace_seconds"
            )
        rotated = await self.hub.keys.rotate(key_id, float(grace))
        if rotated is None:
            raise ApiError(404, f"No usable key with id {key_id[:80]}.", code="key_not_found")
        plaintext, record = rotated
        await self._audit(scope, "key.rotate", key_id, {"grace_seconds": grace})
        await send_bytes(send, 200, [JSON], orjson.dumps({"key": plaintext, **record.public()}))

    async def list_teams(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every team with its limits, its keys and their spend in its budget period."""
        now = self.hub.clock.time()
        data = []
        for team in await self.hub.teams.list():
            period = period_of(team.budget_period, now)
            data.append(
                {
                    **team.public(),
                    "period": period,
                    "spend": await self.hub.teams.spend(team.id, period),
                    "keys": list(await self.hub.teams.keys(team.id)),
                }
            )
        await send_bytes(send, 200, [JSON], orjson.dumps({"object": "list", "data": data}))

    async def create_team(self, scope: Scope, receive: Receive, send: Send) -> None:
        options = team_options(await self._json(scope, receive))
        team = await self.hub.teams.create(**options)
        await self._audit(scope, "team.create", team.id, options)
        await send_bytes(send, 201, [JSON], orjson.dumps(team.public()))

    async def update_team(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await self._json(scope, receive)
        team_id = text_field(data.get("id"), "id")
        changes = key_changes(data, TEAM_FIELDS)
        if await self.hub.teams.get(team_id) is None:
            raise ApiError(404, f"No team with id {team_id[:80]}.", code="team_not_found")
        team = await self.hub.teams.update(team_id, changes)
        await self._audit(scope, "team.update", team_id, changes)
        await send_bytes(send, 200, [JSON], orjson.dumps(team.public() if team else None))

"""Teams: a named group of keys sharing one budget and one set of limits, with its own
spend (what its keys spent). A key names its team (`team_id`); the request is then held to
the key's limits and budget and to the team's.

The hot path reads a team from a local cache (`team_cache_ttl`, a few seconds), so a change
reaches every process within that time; this process sees its own changes at once."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.db import Database
from ballast.state.schema import api_keys, spend_totals, teams

TEAM_FIELDS = ("name", "rpm", "tpm", "max_parallel", "budget", "budget_period")


@dataclass(frozen=True, slots=True)
class Team:
    id: str
    name: str
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget: float | None = None
    budget_period: str = "month"
    created_at: float = 0.0

    def public(self) -> dict[str, Any]:
        return asdict(self)


def _team(row: Any) -> Team:
    return Team(
        id=row.id,
        name=row.name,
        rpm=row.rpm,
        tpm=row.tpm,
        max_parallel=row.max_parallel,
        budget=row.budget,
        budget_period=row.budget_period,
        created_at=row.created_at,
    )


class TeamService:
    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK, cache_ttl: float = 5.0) -> None:
        self.db = db
        self.clock = clock
        self.cache_ttl = cache_ttl
        self._cache: dict[str, tuple[Team | None, float]] = {}

    async def create(self, name: str, **options: Any) -> Team:
        team = Team(
            id="team_" + uuid.uuid4().hex[:20], name=name, created_at=self.clock.time(), **options
        )
        async with self.db.begin() as connection:
            await connection.execute(teams.insert().values(**team.public()))
        return team

    async def get(self, team_id: str) -> Team | None:
        async with self.db.connect() as connection:
            row = (await connection.execute(teams.select().where(teams.c.id == team_id))).first()
        return _team(row) if row is not None else None

    async def lookup(self, team_id: str) -> Team | None:
        """`get`, from the local cache when fresh (the hot path)."""
        cached = self._cache.get(team_id)
        now = self.clock.monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        team = await self.get(team_id)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[team_id] = (team, now + self.cache_ttl)
        return team

    async def list(self) -> list[Team]:
        async with self.db.connect() as connection:
            rows = await connection.execute(teams.select().order_by(teams.c.created_at))
            return [_team(row) for row in rows]

    async def update(self, team_id: str, changes: dict[str, Any]) -> Team | None:
        if set(changes) - set(TEAM_FIELDS):
            raise ValueError("unknown team field")
        if changes:
            async with self.db.begin() as connection:
                await connection.execute(
                    teams.update().where(teams.c.id == team_id).values(**changes)
                )
        self._cache.pop(team_id, None)
        return await self.get(team_id)

    async def spend(self, team_id: str, period: str) -> float:
        """What the team's keys spent in the period (as recorded in the database). Keys
        record spend in their own budget period's buckets: a team's month counts its keys'
        months and days in it, its total all of them (a key counting only a total has no
        month to give)."""
        query = (
            sa.select(sa.func.coalesce(sa.func.sum(spend_totals.c.cost), 0.0))
            .select_from(spend_totals.join(api_keys, api_keys.c.id == spend_totals.c.key_id))
            .where(api_keys.c.team_id == team_id)
        )
        if period != "total":
            query = query.where(spend_totals.c.period.startswith(period, autoescape=True))
        async with self.db.connect() as connection:
            return float((await connection.execute(query)).scalar_one())

    async def keys(self, team_id: str) -> tuple[str, ...]:
        async with self.db.connect() as connection:
            rows = await connection.execute(
                sa.select(api_keys.c.id).where(api_keys.c.team_id == team_id)
            )
            return tuple(row.id for row in rows)

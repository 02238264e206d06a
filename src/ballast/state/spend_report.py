"""Spend over time for the admin UI: the `spend_events` rows summed per hour or per UTC day,
by key, by team (the key's team now) or by model. One grouped query, in the database; the
buckets are whole multiples of the bucket's length in seconds since the epoch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ballast.state.db import Database
from ballast.state.schema import api_keys, spend_events, teams

BUCKETS = {"hour": 3600, "day": 86_400}
GROUPS = ("key", "team", "model")
NO_TEAM = "(no team)"


@dataclass(slots=True)
class Series:
    """One key's, team's or model's spend, bucket by bucket (only buckets with spend)."""

    id: str
    name: str
    cost: float = 0.0
    requests: int = 0
    points: list[dict[str, Any]] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "cost": self.cost,
            "requests": self.requests,
            "points": self.points,
        }


class SpendReport:
    def __init__(self, db: Database) -> None:
        self.db = db

    def _bucket(self, seconds: int) -> Any:
        """The bucket's number: a floor that both databases compute the same way (SQLite's
        cast truncates, which is the floor for times after 1970; PostgreSQL's rounds)."""
        scaled = spend_events.c.created_at / seconds
        if self.db.is_sqlite:
            return sa.cast(scaled, sa.Integer)
        return sa.cast(sa.func.floor(scaled), sa.BigInteger)

    async def series(self, by: str, bucket: str, since: float, until: float) -> list[Series]:
        """Every key's (team's, model's) spend in [since, until), the costliest first."""
        seconds = BUCKETS[bucket]
        number = self._bucket(seconds).label("bucket")
        events = spend_events
        ident: Any
        if by == "model":
            ident = events.c.model
            name: Any = events.c.model
            source: Any = events
        elif by == "key":
            ident = events.c.key_id
            name = sa.func.coalesce(api_keys.c.name, events.c.key_id)
            source = events.outerjoin(api_keys, api_keys.c.id == events.c.key_id)
        else:
            ident = sa.func.coalesce(api_keys.c.team_id, "")
            name = sa.func.coalesce(teams.c.name, api_keys.c.team_id, NO_TEAM)
            source = events.outerjoin(api_keys, api_keys.c.id == events.c.key_id).outerjoin(
                teams, teams.c.id == api_keys.c.team_id
            )
        query = (
            sa.select(
                ident.label("ident"),
                sa.func.max(name).label("name"),
                number,
                sa.func.count().label("requests"),
                sa.func.sum(events.c.prompt_tokens).label("input_tokens"),
                sa.func.sum(events.c.completion_tokens).label("output_tokens"),
                sa.func.sum(events.c.cost).label("cost"),
            )
            .select_from(source)
            .where(events.c.created_at >= since, events.c.created_at < until)
            .group_by(ident, number)
            .order_by(number)
        )
        found: dict[str, Series] = {}
        async with self.db.connect() as connection:
            for row in await connection.execute(query):
                series = found.get(row.ident)
                if series is None:
                    series = found[row.ident] = Series(row.ident, row.name or row.ident)
                cost = float(row.cost or 0.0)
                series.cost += cost
                series.requests += int(row.requests)
                series.points.append(
                    {
                        "t": int(row.bucket) * seconds,
                        "cost": cost,
                        "requests": int(row.requests),
                        "input_tokens": int(row.input_tokens or 0),
                        "output_tokens": int(row.output_tokens or 0),
                    }
                )
        return sorted(found.values(), key=lambda s: (-s.cost, s.name))

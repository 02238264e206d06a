"""Spend over time for the admin UI: `spend_events` summed per hour or UTC day, by key, by
team and by model, in the database. `check_series` runs against PostgreSQL too
(tests/integration/test_spend_pg.py): the two databases compute a bucket differently."""

from __future__ import annotations

import uuid

from ballast.resilience.clock import ManualClock
from ballast.state.db import Database
from ballast.state.keys import KeyService
from ballast.state.schema import spend_events
from ballast.state.spend_report import NO_TEAM, Series, SpendReport
from ballast.state.teams import TeamService

HOUR, DAY = 3600, 86_400
DAY_ONE = 1_700_006_400  # 2023-11-15T00:00:00Z, the start of a UTC day


async def check_series(db: Database) -> None:
    clock = ManualClock()
    # The PostgreSQL database is shared with other tests and earlier runs: names and the
    # day of this run's spend are its own.
    tag = uuid.uuid4().hex[:8]
    base = DAY_ONE + DAY * (int(tag, 16) % 100_000)
    team = await TeamService(db, clock).create(f"alpha-{tag}")
    keys = KeyService(db, clock=clock)
    _, one = await keys.create(f"one-{tag}", team_id=team.id)
    _, two = await keys.create(f"two-{tag}")
    gone = f"key_gone_{tag}"  # spend of a key no longer in the table
    m1, m2 = f"m1-{tag}", f"m2-{tag}"
    events = [
        (one.id, m1, base + 10, 1.0),
        (one.id, m2, base + HOUR - 1, 2.0),
        (one.id, m1, base + HOUR, 4.0),
        (two.id, m1, base + 2 * HOUR + 5, 8.0),
        (gone, m1, base + 20, 16.0),
        (two.id, m1, base - 1, 32.0),  # before `since`
        (two.id, m1, base + DAY, 64.0),  # at `until`: not in
    ]
    async with db.begin() as connection:
        for key_id, model, when, cost in events:
            await connection.execute(
                spend_events.insert().values(
                    id=uuid.uuid4().hex,
                    key_id=key_id,
                    period="total",
                    model=model,
                    deployment="a",
                    prompt_tokens=1,
                    completion_tokens=2,
                    cost=cost,
                    created_at=float(when),
                )
            )
    report = SpendReport(db)

    def points(series: Series) -> list[tuple[int, float, int]]:
        return [(p["t"], p["cost"], p["requests"]) for p in series.points]

    by_key = await report.series("key", "hour", base, base + DAY)
    mine = [s for s in by_key if s.id in (one.id, two.id, gone)]
    assert [(s.id, s.name, s.cost, s.requests) for s in mine] == [
        (gone, gone, 16.0, 1),
        (two.id, f"two-{tag}", 8.0, 1),
        (one.id, f"one-{tag}", 7.0, 3),
    ]
    assert points(mine[2]) == [(base, 3.0, 2), (base + HOUR, 4.0, 1)]
    assert points(mine[1]) == [(base + 2 * HOUR, 8.0, 1)]
    assert mine[2].points[0]["input_tokens"] == 2 and mine[2].points[0]["output_tokens"] == 4

    by_team = {s.id: s for s in await report.series("team", "hour", base, base + DAY)}
    assert (by_team[team.id].name, by_team[team.id].cost) == (f"alpha-{tag}", 7.0)
    assert by_team[""].name == NO_TEAM
    assert (base + 2 * HOUR, 8.0, 1) in points(by_team[""])

    by_model = {s.id: s for s in await report.series("model", "day", base, base + DAY)}
    assert points(by_model[m1]) == [(base, 29.0, 4)]
    assert points(by_model[m2]) == [(base, 2.0, 1)]
    wider = {s.id: s for s in await report.series("model", "day", base - DAY, base + 2 * DAY)}
    assert points(wider[m1]) == [(base - DAY, 32.0, 1), (base, 29.0, 4), (base + DAY, 64.0, 1)]


async def test_spend_is_summed_per_bucket_by_key_team_and_model(db: Database) -> None:
    await check_series(db)

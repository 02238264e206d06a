"""Spend on real PostgreSQL and Redis: a database outage under steady recording loses
nothing, and instances sharing one Redis and one database agree on one spend per key.

Faults come from the network (a TCP fault proxy in front of the real services). Costs are
multiples of 2**-20 dollars so that sums are exact in floating point whatever the order of
addition: "equals" below means ==, not approximately, for the database. Redis keeps its
INCRBYFLOAT counters as decimal strings with 17 decimal places, so a counter agrees with the
database to that precision (`same`)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ballast.config import StateSettings
from ballast.state.db import Database, async_url
from ballast.state.schema import spend_events
from ballast.state.spend import SpendEvent, SpendRecorder, counter_name, new_event_id
from ballast.state.store import RedisStore
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

UNIT = 2.0**-20


def via(url: str, port: int) -> str:
    """The same service URL, reached through a local proxy port."""
    return make_url(async_url(url)).set(host="127.0.0.1", port=port).render_as_string(False)


def target(url: str) -> tuple[str, int]:
    parsed = make_url(url)
    assert parsed.host and parsed.port
    return parsed.host, parsed.port


def event(key: str, units: int) -> SpendEvent:
    return SpendEvent(
        id=new_event_id(),
        key_id=key,
        period="total",
        model="gpt-x",
        deployment="dep-a",
        prompt_tokens=units,
        completion_tokens=1,
        cost=units * UNIT,
        cached=False,
        created_at=time.time(),
    )


def same(value: float) -> object:
    return pytest.approx(value, rel=1e-15, abs=1e-16)


def unique_key() -> str:
    return "test-" + new_event_id()[:20]


async def stored(db: Database, key: str) -> tuple[set[str], int, float]:
    async with db.connect() as connection:
        ids = {
            row[0]
            for row in await connection.execute(
                sa.select(spend_events.c.id).where(spend_events.c.key_id == key)
            )
        }
        count, total = (
            await connection.execute(
                sa.select(
                    sa.func.count(), sa.func.coalesce(sa.func.sum(spend_events.c.cost), 0.0)
                ).where(spend_events.c.key_id == key)
            )
        ).one()
    return ids, int(count), float(total)


async def eventually(condition: object, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_database_outage_under_steady_recording_loses_nothing(
    database: Database, database_url: str, tmp_path: Path
) -> None:
    key = unique_key()
    host, port = target(database_url)
    async with FaultProxy(host, port) as proxy:
        db = Database(via(database_url, proxy.port), timeout=0.3)
        recorder = SpendRecorder(
            db,
            None,
            str(tmp_path / "spool" / "spend.journal"),
            flush_interval=0.05,
            max_backoff=0.4,
        )
        await recorder.start()
        recorded: list[SpendEvent] = []
        peak_in_memory = 0
        rng = random.Random(3)
        started = time.monotonic()

        async def traffic() -> None:
            nonlocal peak_in_memory
            while (elapsed := time.monotonic() - started) < 2.4:
                e = event(key, rng.randint(1, 5000))
                recorded.append(e)
                recorder.record(e)
                if 0.6 < elapsed < 1.5:
                    peak_in_memory = max(peak_in_memory, recorder.pending_events)
                await asyncio.sleep(0.004)

        producer = asyncio.create_task(traffic())
        await asyncio.sleep(0.5)
        proxy.blackhole()  # the database stops answering (and accepting) anything
        await asyncio.sleep(1.0)
        outage_failures, outage_spills = recorder.failures, recorder.spills
        proxy.passthrough()
        await producer

        await eventually(
            lambda: recorder.pending_events == 0 and recorder.unflushed(key, "total") == 0
        )
        ids, count, total = await stored(database, key)
        assert outage_failures >= 1 and outage_spills >= 1
        # Memory stayed bounded during the outage: spilled to the journal, not accumulated.
        assert peak_in_memory < len(recorded) / 3
        assert ids == {e.id for e in recorded}
        assert count == len(recorded)
        assert total == sum(e.cost for e in recorded)
        assert await recorder.key_spend(key, "total") == total
        await recorder.close()
        await db.close()


async def test_two_recorders_on_one_redis_and_one_database_agree(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    key = unique_key()
    name = counter_name(key, "total")
    settings = StateSettings()
    dbs = [Database(database_url), Database(database_url)]
    stores = [RedisStore(redis_url, settings), RedisStore(redis_url, settings)]
    await dbs[0].upgrade()
    a, b = (
        SpendRecorder(dbs[i], stores[i], str(tmp_path / f"r{i}" / "spend.journal"))
        for i in range(2)
    )
    await a.start()
    await b.start()
    expected = 0.0
    try:
        for _ in range(10):
            e = event(key, 100)
            expected += e.cost
            a.record(e)
        await a.flush()
        # Increments never create a counter: only a seed from the database sum does.
        assert await stores[0].client.get(name) is None
        assert await b.key_spend(key, "total") == expected  # seeds it
        assert float(await stores[0].client.get(name)) == expected  # type: ignore[arg-type]

        for recorder, n in ((a, 5), (b, 7), (a, 3)):
            for _ in range(n):
                e = event(key, 37)
                expected += e.cost
                recorder.record(e)
        assert await a.key_spend(key, "total") == 10 * 100 * UNIT + 8 * 37 * UNIT  # + unflushed
        await asyncio.gather(a.flush(), b.flush())
        assert float(await stores[0].client.get(name)) == same(expected)  # type: ignore[arg-type]
        assert await a.key_spend(key, "total") == await b.key_spend(key, "total")
        assert await a.key_spend(key, "total") == same(expected)
        assert (await stored(dbs[0], key))[2] == expected

        # A replay of a committed event (crash between commit and journal removal) adds
        # nothing, to the database or to the counter.
        e = event(key, 999)
        expected += e.cost
        a.record(e)
        await a.flush()
        b.record(e)
        await b.flush()
        assert float(await stores[1].client.get(name)) == same(expected)  # type: ignore[arg-type]
        assert await b.key_spend(key, "total") == same(expected)
        assert (await stored(dbs[1], key))[1:] == (10 + 15 + 1, expected)
    finally:
        await a.close()
        await b.close()
        await stores[0].client.delete(name)
        for store in stores:
            await store.close()
        for db in dbs:
            await db.close()


async def test_lost_counter_increment_is_repaired_from_the_database(
    database: Database, redis_url: str, tmp_path: Path
) -> None:
    key = unique_key()
    name = counter_name(key, "total")
    host, port = target(redis_url)
    async with FaultProxy(host, port) as proxy:
        store = RedisStore(f"redis://127.0.0.1:{proxy.port}/0", StateSettings())
        recorder = SpendRecorder(database, store, str(tmp_path / "spend.journal"))
        await recorder.start()
        try:
            recorder.record(event(key, 1000))
            await recorder.flush()
            assert await recorder.key_spend(key, "total") == 1000 * UNIT  # seeded

            proxy.blackhole()
            recorder.record(event(key, 24))
            await recorder.flush()  # committed; the counter's increment is lost
            # Redis unusable: the database sum, still exact.
            assert await recorder.key_spend(key, "total") == 1024 * UNIT

            proxy.passthrough()
            await store.client.connection_pool.disconnect()  # drop connections out of step
            recorder.record(event(key, 3))
            await recorder.flush()  # drops the stale counter instead of adding to it
            assert await recorder.key_spend(key, "total") == 1027 * UNIT
            assert float(await store.client.get(name)) == 1027 * UNIT  # type: ignore[arg-type]
        finally:
            await recorder.close()
            await store.client.delete(name)
            await store.close()


async def test_events_read_back_as_recorded_and_a_repeat_counts_once(
    database: Database, tmp_path: Path
) -> None:
    """Every event goes to PostgreSQL as JSON text: strings JSON must escape, None, booleans,
    the largest token counts and floats come back as they were recorded."""
    key = unique_key()
    models = ["gpt-x", 'q"uote\\back\nline][', "modèle-日本", "tab\there"]
    events = [
        SpendEvent(
            new_event_id(),
            key,
            "total" if i % 2 else "2026-12",
            models[i % len(models)],
            None if i % 2 else f"dep-{i}",
            i,
            2**31 - 1 - i,
            (i + 1) * UNIT,
            bool(i % 2),
            1_764_550_000.123456 + i,
        )
        for i in range(40)
    ]
    recorder = SpendRecorder(database, None, str(tmp_path / "spend.journal"))
    for e in [*events, events[3]]:  # one recorded twice in the same batch
        recorder.record(e)
    await recorder.flush()
    async with database.connect() as connection:
        rows = await connection.execute(sa.select(spend_events).where(spend_events.c.key_id == key))
        assert sorted(SpendEvent(*row) for row in rows) == sorted(events)
    for period in ("total", "2026-12"):
        expected = sum(e.cost for e in events if e.period == period)
        assert await recorder.key_spend(key, period) == expected
    await recorder.close()


async def test_spend_over_time_is_bucketed_as_on_sqlite(database: Database) -> None:
    """PostgreSQL rounds a cast to an integer where SQLite truncates: the report's buckets
    must floor on both (the same checks as tests/unit/state/test_spend_report.py)."""
    from tests.unit.state.test_spend_report import check_series

    await check_series(database)

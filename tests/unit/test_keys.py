"""Virtual keys: hashed at rest, cached, single-flight to the database, served from cache
while the database is down."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from ballast.clock import ManualClock
from ballast.state.db import Database
from ballast.state.keys import KeyService, KeysUnavailable, hash_key
from ballast.state.schema import api_keys


@pytest.fixture
async def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'keys.db'}")
    await database.upgrade()
    yield database  # type: ignore[misc]
    await database.close()


async def test_create_stores_only_a_hash_and_lookup_finds_it(db: Database) -> None:
    keys = KeyService(db, clock=ManualClock())
    plaintext, record = await keys.create("team-a", models=["m1"], rpm=60, budget=5.0)
    assert plaintext.startswith("sk-bl-") and len(plaintext) > 40
    async with db.connect() as connection:
        rows = (await connection.execute(api_keys.select())).all()
    dumped = repr(rows)
    assert plaintext not in dumped
    assert hash_key(plaintext) in dumped
    found = await keys.lookup(plaintext)
    assert found is not None and found.id == record.id and found.models == ("m1",)
    assert found.allows("m1") and not found.allows("m2")
    assert await keys.lookup("sk-bl-unknown") is None


async def test_lookups_are_cached_and_single_flight(db: Database) -> None:
    clock = ManualClock()
    keys = KeyService(db, clock=clock, cache_ttl=30)
    plaintext, _ = await keys.create("a")
    results = await asyncio.gather(*(keys.lookup(plaintext) for _ in range(50)))
    assert all(r is not None for r in results)
    assert keys.db_queries == 1
    await keys.lookup(plaintext)
    assert keys.db_queries == 1
    clock.advance(31)
    await keys.lookup(plaintext)
    assert keys.db_queries == 2


async def test_known_keys_survive_a_database_outage(db: Database, tmp_path: Path) -> None:
    clock = ManualClock()
    keys = KeyService(db, clock=clock, cache_ttl=30)
    plaintext, _ = await keys.create("a")
    assert await keys.lookup(plaintext) is not None
    keys.db = Database("postgresql://nobody@127.0.0.1:1/none", timeout=0.2)  # unreachable
    clock.advance(60)
    assert await keys.lookup(plaintext) is not None  # stale but known: still serves
    with pytest.raises(KeysUnavailable):
        await keys.lookup("sk-bl-never-seen")
    await keys.db.close()


async def test_revoke(db: Database) -> None:
    keys = KeyService(db, clock=ManualClock())
    plaintext, record = await keys.create("a")
    assert await keys.lookup(plaintext) is not None
    assert await keys.revoke(record.id)
    found = await keys.lookup(plaintext)
    assert found is not None and found.revoked
    assert not await keys.revoke("key_missing")
    async with db.connect() as connection:
        count = (
            await connection.execute(sa.select(sa.func.count()).select_from(api_keys))
        ).scalar()
    assert count == 1


def test_head_revision_matches_the_migrations() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from ballast.state.db import HEAD_REVISION, MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD_REVISION


async def test_upgrade_is_skipped_when_the_schema_is_current(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'again.db'}")
    assert await database.revision() is None
    await database.upgrade()
    from ballast.state.db import HEAD_REVISION

    assert await database.revision() == HEAD_REVISION
    await database.upgrade()  # a no-op: nothing to apply
    await database.close()


async def test_workers_starting_together_on_a_new_database_migrate_it_once(
    tmp_path: Path,
) -> None:
    """`serve --workers N` on a new SQLite file: every worker upgrades at once, and none
    may fail on a table another one has just created."""
    from ballast.state.db import HEAD_REVISION

    databases = [Database(f"sqlite:///{tmp_path / 'fresh.db'}") for _ in range(4)]
    try:
        await asyncio.gather(*(database.upgrade() for database in databases))
        assert {await database.revision() for database in databases} == {HEAD_REVISION}
    finally:
        for database in databases:
            await database.close()

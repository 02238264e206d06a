"""Virtual keys: hashed at rest, cached, single-flight to the database, served from cache
while the database is down."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from ballast.config import Settings
from ballast.pipeline.access import Access
from ballast.pipeline.errors import ApiError
from ballast.resilience.clock import ManualClock
from ballast.state.db import Database
from ballast.state.keys import KeyService, KeysUnavailable, hash_key
from ballast.state.ratelimit import RateLimiter
from ballast.state.schema import api_keys
from ballast.state.spend import SpendRecorder


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


async def test_revoking_a_rotated_key_stops_its_old_value_in_its_grace_period_too(
    db: Database,
) -> None:
    clock = ManualClock()
    keys = KeyService(db, clock=clock, cache_ttl=30.0)
    other = KeyService(db, clock=clock, cache_ttl=30.0)  # another worker, on the same database
    old, record = await keys.create("a")
    rotated = await keys.rotate(record.id, grace=3600.0)
    assert rotated is not None
    new = rotated[0]
    for service in (keys, other):  # both remember both values
        for plaintext in (old, new):
            found = await service.lookup(plaintext)
            assert found is not None and not found.revoked
    assert await keys.revoke(record.id)
    other.forget(record.id)  # what the fleet tells every other worker
    for service in (keys, other):
        for plaintext in (old, new):
            found = await service.lookup(plaintext)
            assert found is None or found.revoked, plaintext


async def test_a_key_remembered_by_its_header_still_expires_revokes_and_is_rechecked(
    db: Database, tmp_path: Path
) -> None:
    clock = ManualClock()
    keys = KeyService(db, clock=clock, cache_ttl=30.0)
    settings = Settings.model_validate(
        {
            "server": {"master_key": "sk-master-0123456789"},
            "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:9"}]}],
        }
    )
    spend = SpendRecorder(db, None, str(tmp_path / "spend.journal"), clock=clock)
    access = Access(settings, keys, RateLimiter(None, clock=clock), spend, clock)

    def scope(plaintext: str) -> dict[str, object]:
        return {"headers": [(b"authorization", b"Bearer " + plaintext.encode())]}

    async def refused(plaintext: str) -> str:
        with pytest.raises(ApiError) as error:
            await access.authenticate(scope(plaintext))
        assert error.value.status == 401
        return error.value.message

    short, short_record = await keys.create("short", expires_at=clock.time() + 10)
    assert (await access.authenticate(scope(short))).id == short_record.id
    clock.advance(11)  # still remembered, but expired
    assert "expired" in await refused(short)

    here, _ = await keys.create("revoked here")
    elsewhere, elsewhere_record = await keys.create("revoked by another instance")
    for plaintext in (here, elsewhere):
        await access.authenticate(scope(plaintext))
    queries = keys.db_queries
    assert (await access.authenticate(scope(elsewhere))).id == elsewhere_record.id
    assert keys.db_queries == queries  # from memory
    assert await keys.revoke((await keys.lookup(here)).id)  # type: ignore[union-attr]
    await refused(here)  # at once
    async with db.begin() as connection:  # what another instance's revocation leaves here
        await connection.execute(api_keys.update().values(revoked=True))
    clock.advance(29)
    assert (await access.authenticate(scope(elsewhere))).id == elsewhere_record.id
    clock.advance(2)  # the key cache's TTL: looked up again
    await refused(elsewhere)
    assert await access.authenticate(scope("sk-master-0123456789")) is not None


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


async def test_a_keys_mcp_allowlist_is_kept_in_the_database_and_the_cache(db: Database) -> None:
    from ballast.state.keys import _decode, _encode

    keys = KeyService(db, clock=ManualClock())
    plaintext, record = await keys.create("agent", mcp=["alpha/echo", "beta"])
    found = await keys.lookup(plaintext)
    assert found is not None and found.mcp == ("alpha/echo", "beta")
    assert _decode(_encode(found)) == found
    assert found.allows_tool("alpha", "echo") and found.allows_tool("beta", "any")
    assert not found.allows_tool("alpha", "add")
    changed = await keys.update(record.id, {"mcp": None})
    assert changed is not None and changed.mcp is None and changed.allows_tool("gamma", "x")

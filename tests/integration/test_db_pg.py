"""Setting up a new PostgreSQL database: straight from the tables' metadata, the schema the
migrations build, once however many instances start on it together."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from ballast.state.db import HEAD_REVISION, Database
from tests.schemas import drift, migrate, schema_of

pytestmark = pytest.mark.integration


async def _create(admin: Database, name: str) -> None:
    async with admin.engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(sa.text(f'CREATE DATABASE "{name}"'))


async def _drop(admin: Database, name: str) -> None:
    async with admin.engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
async def new_databases(database_url: str) -> AsyncIterator[list[str]]:
    """Two new, empty databases on the test server; dropped afterwards."""
    admin = Database(database_url)
    names = [f"ballast_new_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    base = database_url.rsplit("/", 1)[0]
    try:
        for name in names:
            await _create(admin, name)
        yield [f"{base}/{name}" for name in names]
    finally:
        for name in names:
            await _drop(admin, name)
        await admin.close()


async def test_a_new_database_gets_what_the_migrations_build(new_databases: list[str]) -> None:
    news = [Database(new_databases[0]) for _ in range(3)]
    migrated = Database(new_databases[1])
    try:
        await asyncio.gather(*(db.upgrade() for db in news))  # instances starting together
        async with migrated.begin() as connection:
            await connection.run_sync(migrate)
        async with news[0].connect() as a, migrated.connect() as b:
            built, expected = await a.run_sync(schema_of), await b.run_sync(schema_of)
            assert await b.run_sync(drift) == []
        assert built == expected
        assert built["revision"] == HEAD_REVISION
    finally:
        for db in (*news, migrated):
            await db.close()

"""Setting up a database: a new one from the tables' metadata, an older one by migrating."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from ballast.state.db import HEAD_REVISION, Database
from tests.schemas import drift, migrate, schema_of


async def test_a_new_database_gets_what_the_migrations_build(tmp_path: Path) -> None:
    new = Database(f"sqlite:///{tmp_path / 'new.db'}")
    migrated = Database(f"sqlite:///{tmp_path / 'migrated.db'}")
    try:
        await new.upgrade()
        async with migrated.begin() as connection:
            await connection.run_sync(migrate)
        async with new.connect() as a, migrated.connect() as b:
            built, expected = await a.run_sync(schema_of), await b.run_sync(schema_of)
            assert await b.run_sync(drift) == []
        assert built == expected
        assert built["revision"] == HEAD_REVISION
        assert {"api_keys", "spend_events", "spend_totals", "jobs"} <= set(built["tables"])
    finally:
        await new.close()
        await migrated.close()


def test_a_new_database_keeps_alembic_out_of_the_serving_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from ballast.state.db import Database

        async def main():
            db = Database("{url}")
            await db.upgrade()
            print(await db.revision(), "alembic" in sys.modules)
            await db.close()

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == [HEAD_REVISION, "False"]

"""What a database's schema is, as data to compare: how a new database is set up (straight
from the tables' metadata) must give what the migrations give."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from ballast.state.db import MIGRATIONS
from ballast.state.schema import metadata


def schema_of(connection: sa.Connection) -> dict[str, Any]:
    """Every table's columns (type, nullability, default), key, indexes and unique
    constraints, and the recorded revision."""
    inspector = sa.inspect(connection)
    tables: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        tables[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], c.get("default"))
                for c in inspector.get_columns(table)
            ],
            "key": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in inspector.get_indexes(table)
            ),
            "unique": sorted(
                tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)
            ),
        }
    revision = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return {"tables": tables, "revision": revision}


def migrate(connection: sa.Connection) -> None:
    """Run every migration, as an existing deployment gets them."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def drift(connection: sa.Connection) -> list[Any]:
    """What the tables' metadata and a migrated schema disagree on (nothing, when in step)."""
    return list(compare_metadata(MigrationContext.configure(connection), metadata))

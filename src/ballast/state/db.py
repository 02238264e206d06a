"""The database: SQLite (embedded default) or PostgreSQL (several instances), chosen by URL,
behind the one breaker so a dead database fails fast instead of piling up requests."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ballast.state.schema import metadata

log = logging.getLogger("ballast.db")
logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per plugin is noise

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest migration. Keep it in step with migrations/versions (a test checks): a database
# already there is not handed to alembic at all, which keeps it out of the process.
HEAD_REVISION = "0009"


def async_url(url: str) -> str:
    """Accept plain `sqlite:///` and `postgresql://` URLs and pick the async drivers."""
    if url.startswith("sqlite://"):
        return "sqlite+aiosqlite://" + url.removeprefix("sqlite://")
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    return url


class Database:
    def __init__(self, url: str, pool_size: int = 10, timeout: float = 5.0) -> None:
        self.url = async_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        options: dict[str, Any] = {}
        if self.is_sqlite:
            path = self.url.split(":///", 1)[1] if ":///" in self.url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            if not path or path == ":memory:":
                options["poolclass"] = sa.pool.StaticPool
            options["connect_args"] = {"timeout": timeout}
        else:
            options.update(
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=timeout,
                pool_pre_ping=True,
                connect_args={"timeout": timeout, "command_timeout": timeout},
            )
        self.engine: AsyncEngine = create_async_engine(self.url, **options)
        # Statements sent, so an operator (and the fleet's test) can see what falls back to
        # the database when Redis is away: the fleet view shows it per worker.
        self.statements = 0
        sa.event.listen(self.engine.sync_engine, "before_cursor_execute", self._count)
        self._file = Path(path) if self.is_sqlite and path and path != ":memory:" else None
        if self._file is not None:
            sa.event.listen(self.engine.sync_engine, "connect", _write_ahead_log)

    def _count(self, *_: Any) -> None:
        self.statements += 1

    async def upgrade(self) -> None:
        """Apply every pending migration (idempotent; serialised across instances and
        workers: those of `serve --workers N` all start at once on a new database)."""
        if await self.revision() == HEAD_REVISION:
            return
        async with self._migration_lock(), self.engine.begin() as connection:
            if not self.is_sqlite:
                await connection.execute(sa.text("SELECT pg_advisory_xact_lock(4242001)"))
            await connection.run_sync(_upgrade)  # nothing to do if another got there first

    @contextlib.asynccontextmanager
    async def _migration_lock(self) -> AsyncIterator[None]:
        """SQLite's stand-in for PostgreSQL's advisory lock: a lock on a file next to the
        database (not the database file: closing any descriptor of it would drop SQLite's
        own locks in this process)."""
        if self._file is None:
            yield
            return
        fd = os.open(
            self._file.with_name(self._file.name + ".migrate-lock"), os.O_RDWR | os.O_CREAT
        )
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    async def revision(self) -> str | None:
        """The schema's current migration, or None for an empty database."""
        try:
            async with self.engine.connect() as connection:
                row = (
                    await connection.execute(sa.text("SELECT version_num FROM alembic_version"))
                ).first()
        except sa.exc.SQLAlchemyError:
            return None
        return str(row[0]) if row is not None else None

    def connect(self) -> Any:
        return self.engine.connect()

    def begin(self) -> Any:
        return self.engine.begin()

    async def ping(self) -> None:
        async with self.engine.connect() as connection:
            await connection.execute(sa.text("SELECT 1"))

    async def close(self) -> None:
        await self.engine.dispose()


def _write_ahead_log(dbapi_connection: Any, _record: Any) -> None:
    """SQLite in WAL mode: reads (key lookups, budget checks) no longer wait for a spend
    flush to commit, and a commit is one sync of the log instead of several of a rollback
    journal. `synchronous=FULL` keeps every commit durable across a power loss."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
    finally:
        cursor.close()


# alembic's record of the schema's revision, as alembic itself creates it.
_VERSION = sa.Table(
    "alembic_version",
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


def _upgrade(connection: sa.Connection) -> None:
    """Bring the schema to the head revision, under the migration lock. A new database gets
    it straight from `schema.metadata` (the same schema, a test checks) and is stamped with
    the head revision: importing alembic adds about 12 MB to a process for good, and the
    first worker on a new database would carry that for its whole life. An older schema goes
    through the migrations; one already at the head (another worker got there first) is
    left alone."""
    inspector = sa.inspect(connection)
    if not inspector.get_table_names():
        metadata.create_all(connection)
        _VERSION.create(connection)
        connection.execute(_VERSION.insert().values(version_num=HEAD_REVISION))
        return
    if inspector.has_table(_VERSION.name):
        if connection.execute(sa.select(_VERSION.c.version_num)).scalar() == HEAD_REVISION:
            return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")

"""Ballast's durable record of service sessions: one per (credential, model), reused for every
new run so the remote keeps its session state across run replacements."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path


def sqlite_path(database_url: str) -> str | None:
    """The file behind a `sqlite...:///path` URL; None for other databases."""
    if not database_url.startswith("sqlite"):
        return None
    _, _, rest = database_url.partition(":///")
    return rest or ":memory:"


class SessionStore:
    """SQLite-backed; calls run in a worker thread and only when a run is created."""

    def __init__(self, path: str | None) -> None:
        self._path = path or ":memory:"
        self._memory: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self._path, check_same_thread=False)
            db.execute(
                "CREATE TABLE IF NOT EXISTS service_sessions ("
                "credential TEXT NOT NULL, model TEXT NOT NULL, session_id TEXT NOT NULL, "
                "PRIMARY KEY (credential, model))"
            )
            db.commit()
            self._db = db
        return self._db

    def _get_or_create(self, credential: str, model: str, new_id: str) -> str:
        db = self._connect()
        db.execute(
            "INSERT OR IGNORE INTO service_sessions (credential, model, session_id) "
            "VALUES (?, ?, ?)",
            (credential, model, new_id),
        )
        db.commit()
        row = db.execute(
            "SELECT session_id FROM service_sessions WHERE credential = ? AND model = ?",
            (credential, model),
        ).fetchone()
        return str(row[0])

    async def get_or_create(self, credential: str, model: str, make_id: Callable[[], str]) -> str:
        key = (credential, model)
        known = self._memory.get(key)
        if known is not None:
            return known
        async with self._lock:
            session_id = await asyncio.to_thread(self._get_or_create, credential, model, make_id())
        self._memory[key] = session_id
        return session_id

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

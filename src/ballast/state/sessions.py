"""Ballast's durable record of service sessions: one per (credential, model), reused for every
new run so the remote keeps its session state across run replacements."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import sqlalchemy as sa

from ballast.state.db import Database
from ballast.state.schema import service_sessions


class SessionStore:
    """Database-backed; asked only when a run is created, never per request."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._memory: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()

    async def get_or_create(self, credential: str, model: str, make_id: Callable[[], str]) -> str:
        key = (credential, model)
        known = self._memory.get(key)
        if known is not None:
            return known
        async with self._lock:
            known = self._memory.get(key)
            if known is None:
                known = await self._get_or_create(credential, model, make_id())
                self._memory[key] = known
        return known

    async def _get_or_create(self, credential: str, model: str, new_id: str) -> str:
        where = (service_sessions.c.credential == credential) & (service_sessions.c.model == model)
        async with self.db.begin() as connection:
            row = (
                await connection.execute(sa.select(service_sessions.c.session_id).where(where))
            ).first()
            if row is not None:
                return str(row.session_id)
            try:
                await connection.execute(
                    service_sessions.insert().values(
                        credential=credential, model=model, session_id=new_id
                    )
                )
            except sa.exc.IntegrityError:
                pass
        async with self.db.connect() as connection:
            row = (
                await connection.execute(sa.select(service_sessions.c.session_id).where(where))
            ).first()
        return str(row.session_id) if row is not None else new_id

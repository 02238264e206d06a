"""The audit log of admin actions, kept in the database: who (which credential, never its
value), what (an action, its target and the fields it set, never a key's secret) and when.
Rows are kept; an operator prunes them as any other history."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ballast.state.db import Database
from ballast.state.schema import admin_audit

MAX_TARGET = 200


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    created_at: float
    actor: str
    action: str
    target: str | None
    detail: dict[str, Any] | None

    def public(self) -> dict[str, Any]:
        return asdict(self)


class AuditLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(
        self, now: float, actor: str, action: str, target: str | None, detail: dict[str, Any]
    ) -> None:
        async with self.db.begin() as connection:
            await connection.execute(
                admin_audit.insert().values(
                    created_at=now,
                    actor=actor[:40],
                    action=action[:40],
                    target=target[:MAX_TARGET] if target is not None else None,
                    detail=orjson.dumps(detail).decode() if detail else None,
                )
            )

    async def recent(self, limit: int = 100, before: int | None = None) -> list[AuditEntry]:
        """The newest entries first; `before` pages back from a `seq` already seen."""
        query = sa.select(admin_audit).order_by(admin_audit.c.seq.desc()).limit(limit)
        if before is not None:
            query = query.where(admin_audit.c.seq < before)
        async with self.db.connect() as connection:
            rows = await connection.execute(query)
            return [
                AuditEntry(
                    seq=row.seq,
                    created_at=row.created_at,
                    actor=row.actor,
                    action=row.action,
                    target=row.target,
                    detail=orjson.loads(row.detail) if row.detail else None,
                )
                for row in rows
            ]

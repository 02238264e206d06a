"""The admin command log: every drain, enable, reload and key change, for the workers and
instances that Redis pub/sub could not reach (Redis down or not configured). Each reader
polls for rows after the last `seq` it saw; rows older than a day are pruned."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ballast.state.db import Database
from ballast.state.schema import admin_commands

log = logging.getLogger("ballast.fleet")

KEEP_SECONDS = 86_400.0
CHANNEL = "ballast:admin"  # the Redis pub/sub channel the same commands travel on


@dataclass(frozen=True, slots=True)
class Command:
    id: str
    action: str
    args: dict[str, Any]
    origin: str = ""  # instance/pid that issued it

    def dumps(self) -> bytes:
        return orjson.dumps(
            {"id": self.id, "action": self.action, "args": self.args, "origin": self.origin}
        )

    @classmethod
    def loads(cls, data: bytes | str) -> Command:
        """ValueError when it is not a command."""
        try:
            raw = orjson.loads(data)
            command = cls(str(raw["id"]), str(raw["action"]), dict(raw["args"]), str(raw["origin"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an admin command: {exc}") from None
        return command


class CommandLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(self, command: Command, now: float) -> None:
        async with self.db.begin() as connection:
            await connection.execute(
                admin_commands.insert().values(
                    id=command.id,
                    action=command.action,
                    args=orjson.dumps({"args": command.args, "origin": command.origin}).decode(),
                    created_at=now,
                )
            )
            await connection.execute(
                admin_commands.delete().where(admin_commands.c.created_at < now - KEEP_SECONDS)
            )

    async def last_seq(self) -> int:
        async with self.db.connect() as connection:
            found = await connection.execute(sa.select(sa.func.max(admin_commands.c.seq)))
            return int(found.scalar() or 0)

    async def since(self, seq: int, limit: int = 100) -> list[tuple[int, Command]]:
        async with self.db.connect() as connection:
            rows = await connection.execute(
                sa.select(admin_commands)
                .where(admin_commands.c.seq > seq)
                .order_by(admin_commands.c.seq)
                .limit(limit)
            )
            out = []
            for row in rows:
                extra = orjson.loads(row.args)
                command = Command(row.id, row.action, extra["args"], extra.get("origin", ""))
                out.append((int(row.seq), command))
            return out

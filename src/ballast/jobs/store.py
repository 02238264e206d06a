"""Job rows: creation with the key's concurrency slot, leases claimed with `FOR UPDATE SKIP
LOCKED`, heartbeats, and terminal transitions as conditional updates.

Every write by a dispatcher is conditional on its lease, and every terminal write on the job
not being terminal yet, so each side effect happens once however many instances race. A
slot is `holds_slot` on the row: set at creation, cleared by the terminal update itself."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline
from ballast.state.db import Database
from ballast.state.schema import jobs

ACTIVE = ("queued", "submitting", "running")
TERMINAL = ("succeeded", "failed", "cancelled")


class SlotsFull(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} concurrent jobs")
        self.limit = limit


class QueueFull(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    key_id: str
    backend: str
    input: Any
    status: str
    cancel_requested: bool
    holds_slot: bool
    remote_id: str | None
    remote_status: str | None
    submissions: int
    progress: float | None
    output: Any
    error: dict[str, Any] | None
    created_at: float
    submitted_at: float | None
    finished_at: float | None
    last_contact_at: float | None
    next_poll_at: float
    polls: int
    lease_owner: str | None
    lease_until: float

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def public(self) -> dict[str, Any]:
        status = self.status
        if status == "submitting":
            status = "queued"
        if self.cancel_requested and not self.terminal:
            status = "cancelling"
        return {
            "id": self.id,
            "object": "job",
            "backend": self.backend,
            "status": status,
            "progress": self.progress,
            "output": self.output,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


def _job(row: Any) -> Job:
    m = row._mapping
    return Job(
        id=m["id"],
        key_id=m["key_id"],
        backend=m["backend"],
        input=orjson.loads(m["input"]),
        status=m["status"],
        cancel_requested=bool(m["cancel_requested"]),
        holds_slot=bool(m["holds_slot"]),
        remote_id=m["remote_id"],
        remote_status=m["remote_status"],
        submissions=m["submissions"],
        progress=m["progress"],
        output=orjson.loads(m["output"]) if m["output"] is not None else None,
        error=orjson.loads(m["error"]) if m["error"] is not None else None,
        created_at=m["created_at"],
        submitted_at=m["submitted_at"],
        finished_at=m["finished_at"],
        last_contact_at=m["last_contact_at"],
        next_poll_at=m["next_poll_at"],
        polls=m["polls"],
        lease_owner=m["lease_owner"],
        lease_until=m["lease_until"],
    )


def error_json(message: str, code: str) -> str:
    return orjson.dumps({"message": message, "code": code}).decode()


class JobStore:
    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK, lease_time: float = 30.0) -> None:
        self.db = db
        self.clock = clock
        self.lease_time = lease_time
        self._local = asyncio.Lock()  # SQLite: serialise slot checks within this process
        self._changed = asyncio.Event()

    # -- change notification (long polls on this instance wake at once) ---------------

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:  # noqa: ASYNC109
        with (
            contextlib.suppress(TimeoutError),
            Deadline(self.clock, self.clock.monotonic() + timeout),
        ):
            await self._changed.wait()

    # -- the client's side ------------------------------------------------------------

    async def create(
        self,
        key_id: str,
        backend: str,
        payload: Any,
        max_slots: int | None,
        max_queued: int,
    ) -> Job:
        """The row is written before any remote call; the slot is taken with it."""
        now = self.clock.time()
        job_id = "job_" + uuid.uuid4().hex[:24]
        values = {
            "id": job_id,
            "key_id": key_id,
            "backend": backend,
            "input": orjson.dumps(payload).decode(),
            "status": "queued",
            "cancel_requested": False,
            "holds_slot": True,
            "submissions": 0,
            "created_at": now,
            "next_poll_at": now,
            "polls": 0,
            "lease_until": 0.0,
        }
        async with self._local, self.db.begin() as conn:
            if not self.db.is_sqlite:
                await conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": "jobs:" + key_id}
                )
            if max_slots is not None:
                held = await conn.scalar(
                    sa.select(sa.func.count())
                    .select_from(jobs)
                    .where(jobs.c.key_id == key_id, jobs.c.holds_slot.is_(True))
                )
                if (held or 0) >= max_slots:
                    raise SlotsFull(max_slots)
            waiting = await conn.scalar(
                sa.select(sa.func.count())
                .select_from(jobs)
                .where(
                    jobs.c.backend == backend,
                    jobs.c.status == "queued",
                    jobs.c.remote_id.is_(None),
                )
            )
            if (waiting or 0) >= max_queued:
                raise QueueFull
            await conn.execute(jobs.insert().values(**values))
        self.notify()
        job = await self.get(job_id)
        assert job is not None
        return job

    async def get(self, job_id: str, key_id: str | None = None) -> Job | None:
        query = sa.select(jobs).where(jobs.c.id == job_id)
        if key_id is not None:
            query = query.where(jobs.c.key_id == key_id)
        async with self.db.connect() as conn:
            row = (await conn.execute(query)).first()
        return _job(row) if row is not None else None

    async def for_key(
        self, key_id: str, limit: int = 20, before: float | None = None, status: str | None = None
    ) -> list[Job]:
        query = sa.select(jobs).where(jobs.c.key_id == key_id)
        if before is not None:
            query = query.where(jobs.c.created_at < before)
        if status is not None:
            query = query.where(jobs.c.status == status)
        query = query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
        async with self.db.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_job(r) for r in rows]

    async def slots_held(self, key_id: str) -> int:
        async with self.db.connect() as conn:
            held = await conn.scalar(
                sa.select(sa.func.count())
                .select_from(jobs)
                .where(jobs.c.key_id == key_id, jobs.c.holds_slot.is_(True))
            )
        return int(held or 0)

    async def request_cancel(self, job_id: str, key_id: str) -> Job | None:
        """A job never sent anywhere is cancelled at once; otherwise the cancel is a request
        the dispatcher carries to the backend, and the job shows `cancelling` until then."""
        now = self.clock.time()
        async with self.db.begin() as conn:
            await conn.execute(
                jobs.update()
                .where(
                    jobs.c.id == job_id,
                    jobs.c.key_id == key_id,
                    jobs.c.status == "queued",
                    jobs.c.remote_id.is_(None),
                )
                .values(
                    status="cancelled",
                    holds_slot=False,
                    cancel_requested=True,
                    finished_at=now,
                    lease_owner=None,
                )
            )
            await conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.key_id == key_id, jobs.c.status.in_(ACTIVE))
                .values(cancel_requested=True, next_poll_at=now)
            )
        self.notify()
        return await self.get(job_id, key_id)

    # -- the dispatcher's side --------------------------------------------------------

    async def claim(
        self, owner: str, lease_time: float, limit: int, backends: list[str], skip: set[str]
    ) -> list[Job]:
        """Due jobs this instance may work on: its own, unleased ones and expired leases."""
        if limit <= 0 or not backends:
            return []
        now = self.clock.time()
        due = (
            sa.select(jobs.c.id)
            .where(
                jobs.c.status.in_(ACTIVE),
                jobs.c.backend.in_(backends),
                jobs.c.next_poll_at <= now,
                sa.or_(
                    jobs.c.lease_owner == owner,
                    jobs.c.lease_owner.is_(None),
                    jobs.c.lease_until < now,
                ),
            )
            .order_by(jobs.c.next_poll_at)
            .limit(limit)
        )
        if skip:
            due = due.where(jobs.c.id.not_in(skip))
        if not self.db.is_sqlite:
            due = due.with_for_update(skip_locked=True)
        statement = (
            jobs.update()
            .where(jobs.c.id.in_(due.scalar_subquery()))
            .values(lease_owner=owner, lease_until=now + lease_time)
            .returning(*jobs.c)
        )
        async with self.db.begin() as conn:
            rows = (await conn.execute(statement)).all()
        return sorted((_job(r) for r in rows), key=lambda j: j.next_poll_at)

    async def renew(self, owner: str, lease_time: float) -> None:
        async with self.db.begin() as conn:
            await conn.execute(
                jobs.update()
                .where(jobs.c.lease_owner == owner, jobs.c.status.in_(ACTIVE))
                .values(lease_until=self.clock.time() + lease_time)
            )

    async def release_leases(self, owner: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(
                jobs.update()
                .where(jobs.c.lease_owner == owner)
                .values(lease_owner=None, lease_until=0.0)
            )

    async def _update(
        self, job_id: str, owner: str, states: tuple[str, ...], **values: Any
    ) -> bool:
        async with self.db.begin() as conn:
            result = await conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.lease_owner == owner, jobs.c.status.in_(states))
                .values(**values)
            )
        changed = bool(result.rowcount)
        if changed:
            self.notify()
        return changed

    async def begin_submit(self, job_id: str, owner: str) -> bool:
        """queued -> submitting, written before the remote call (a crash after it is never
        followed by a blind resubmission)."""
        async with self.db.begin() as conn:
            result = await conn.execute(
                jobs.update()
                .where(
                    jobs.c.id == job_id,
                    jobs.c.lease_owner == owner,
                    jobs.c.status == "queued",
                    jobs.c.remote_id.is_(None),
                    jobs.c.cancel_requested.is_(False),
                )
                .values(status="submitting", submissions=jobs.c.submissions + 1)
            )
        return bool(result.rowcount)

    async def submitted(
        self,
        job_id: str,
        owner: str,
        remote_id: str,
        remote_status: str,
        status: str,
        next_poll: float,
    ) -> bool:
        now = self.clock.time()
        return await self._update(
            job_id,
            owner,
            ("submitting",),
            status=status,
            remote_id=remote_id,
            remote_status=remote_status,
            submitted_at=now,
            last_contact_at=now,
            next_poll_at=next_poll,
            progress=0.0,
        )

    async def requeue(self, job_id: str, owner: str, next_poll: float) -> bool:
        """The remote certainly did not take the job (refused connection, 5xx, 429)."""
        return await self._update(
            job_id, owner, ("submitting",), status="queued", next_poll_at=next_poll
        )

    async def defer(self, job_id: str, owner: str, next_poll: float) -> bool:
        return await self._update(job_id, owner, ACTIVE, next_poll_at=next_poll)

    async def heartbeat(
        self,
        job: Job,
        owner: str,
        status: str,
        remote_status: str,
        progress: float | None,
        next_poll: float,
    ) -> bool:
        """The remote answered: the job lives on, however long it has been running."""
        now = self.clock.time()
        return await self._update(
            job.id,
            owner,
            ("queued", "running"),
            status=status,
            remote_status=remote_status,
            progress=progress,
            last_contact_at=now,
            next_poll_at=next_poll,
            polls=jobs.c.polls + 1,
            lease_until=now + self.lease_time,
        )

    async def no_contact(self, job_id: str, owner: str, next_poll: float) -> bool:
        return await self._update(
            job_id, owner, ACTIVE, next_poll_at=next_poll, polls=jobs.c.polls + 1
        )

    async def finish(
        self,
        job_id: str,
        owner: str | None,
        status: str,
        *,
        remote_status: str | None = None,
        output: Any = None,
        error: tuple[str, str] | None = None,
        progress: float | None = None,
        contact: bool = False,
    ) -> bool:
        """The one terminal transition: conditional on the job not being terminal yet, and
        releasing its slot in the same statement. True for the caller that made it."""
        assert status in TERMINAL
        now = self.clock.time()
        values: dict[str, Any] = {
            "status": status,
            "holds_slot": False,
            "finished_at": now,
            "lease_owner": None,
            "lease_until": 0.0,
            "output": orjson.dumps(output).decode() if output is not None else None,
            "error": error_json(*error) if error is not None else None,
        }
        if remote_status is not None:
            values["remote_status"] = remote_status
        if progress is not None:
            values["progress"] = progress
        if contact:
            values["last_contact_at"] = now
        condition = [jobs.c.id == job_id, jobs.c.status.in_(ACTIVE)]
        if owner is not None:
            condition.append(jobs.c.lease_owner == owner)
        async with self.db.begin() as conn:
            result = await conn.execute(jobs.update().where(*condition).values(**values))
        finished = bool(result.rowcount)
        if finished:
            self.notify()
        return finished

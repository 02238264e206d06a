"""Hypothesis drives submissions, remote statuses, outages, cancels, time and restarts
(an instance vanishing without shutdown) against the real store and dispatcher. After every
step: no slot leaks, no terminal job ever changes again, no job is submitted twice, and no
job is failed as lost while the remote was answering within the bound."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ballast.config import JobBackendSettings, JobBreakerSettings, JobsSettings
from ballast.jobs.backends.base import NotFound, RateLimited, Remote, Unreachable
from ballast.jobs.backends.runpod import parse
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import ACTIVE, JobStore, QueueFull, SlotsFull
from ballast.resilience.clock import ManualClock
from ballast.state.db import Database
from ballast.state.schema import metadata

WORDS = ["IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "WARMING"]
MODES = ["ok", "unreachable", "429", "404"]
KEYS = ["k1", "k2"]
SLOTS = 2
BOUND = 600.0


class ScriptedRemote:
    """The remote side, scripted by the state machine (the boundary, not the code under test)."""

    name = "gpu"

    def __init__(self, settings: JobBackendSettings, clock: ManualClock) -> None:
        self.settings = settings
        self.clock = clock
        self.mode = "ok"
        self.fail_submit = False
        self.words: dict[str, str] = {}
        self.submits: dict[str, int] = {}
        self.last_answer: dict[str, float] = {}

    def _gate(self, remote_id: str, status: bool = False) -> None:
        if self.mode == "unreachable":
            raise Unreachable("scripted outage")
        if status and self.mode in ("ok", "429"):
            self.last_answer[remote_id] = self.clock.time()  # a live answer (429 included)
        if self.mode == "429":
            raise RateLimited(5.0)
        if self.mode == "404":
            raise NotFound("scripted")

    async def submit(self, job_id: str, payload: Any) -> Remote:
        if self.fail_submit or self.mode != "ok":
            raise Unreachable("refused")
        self.submits[job_id] = self.submits.get(job_id, 0) + 1
        remote_id = "r-" + job_id
        self.words[remote_id] = "IN_QUEUE"
        self.last_answer[remote_id] = self.clock.time()
        return parse({"id": remote_id, "status": "IN_QUEUE"})

    async def status(self, remote_id: str) -> Remote:
        self._gate(remote_id, status=True)
        return parse({"id": remote_id, "status": self.words[remote_id], "output": {"ok": 1}})

    async def cancel(self, remote_id: str) -> Remote | None:
        self._gate(remote_id)
        if self.words[remote_id] in ("IN_QUEUE", "IN_PROGRESS", "WARMING"):
            self.words[remote_id] = "CANCELLED"
        return None

    async def close(self) -> None:
        return None


class JobsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.settings = JobBackendSettings(
            protocol="runpod",
            url="http://127.0.0.1:9",
            poll_interval=5.0,
            max_poll_interval=60.0,
            lost_contact_timeout=BOUND,
            retention=1800.0,
            max_queued=5,
            breaker=JobBreakerSettings(failure_threshold=2, open_time=20.0, probe_timeout=100.0),
        )
        self.jobs_settings = JobsSettings(backends={"gpu": self.settings}, lease_time=30.0)
        self.remote = ScriptedRemote(self.settings, self.clock)
        # A file, as in production: an in-memory database is one shared connection.
        self.tmp = tempfile.TemporaryDirectory()
        self.db = Database(f"sqlite+aiosqlite:///{self.tmp.name}/jobs.db")
        self.run(self._create_tables())
        self.store = JobStore(self.db, self.clock, lease_time=30.0)
        self.generation = 0
        self.dispatcher = self._dispatcher()
        self.ids: list[str] = []
        self.terminal: dict[str, tuple[Any, ...]] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _create_tables(self) -> None:
        async with self.db.begin() as conn:
            await conn.run_sync(metadata.create_all)

    def _dispatcher(self) -> Dispatcher:
        self.generation += 1
        return Dispatcher(
            self.jobs_settings,
            self.store,
            self.clock,
            backends={"gpu": self.remote},
            owner=f"instance-{self.generation}",
        )

    def teardown(self) -> None:
        self.run(self.db.close())
        self.loop.close()
        self.tmp.cleanup()

    # -- rules ------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS))
    def submit(self, key: str) -> None:
        try:
            job = self.run(self.store.create(key, "gpu", {"n": len(self.ids)}, SLOTS, 5))
        except (SlotsFull, QueueFull):
            return
        self.ids.append(job.id)

    @rule(index=st.integers(0, 30), word=st.sampled_from(WORDS))
    def remote_says(self, index: int, word: str) -> None:
        remote_ids = sorted(self.remote.words)
        if remote_ids:
            self.remote.words[remote_ids[index % len(remote_ids)]] = word

    @rule(mode=st.sampled_from(MODES))
    def backend_health(self, mode: str) -> None:
        self.remote.mode = mode

    @rule(fail=st.booleans())
    def submissions_fail(self, fail: bool) -> None:
        self.remote.fail_submit = fail

    @rule(index=st.integers(0, 30), key=st.sampled_from(KEYS))
    def cancel(self, index: int, key: str) -> None:
        if self.ids:
            self.run(self.store.request_cancel(self.ids[index % len(self.ids)], key))

    @rule(seconds=st.sampled_from([1.0, 6.0, 31.0, 120.0, 700.0, 2000.0]), ticks=st.integers(1, 3))
    def time_passes(self, seconds: float, ticks: int) -> None:
        for _ in range(ticks):
            self.clock.advance(seconds / ticks)
            self.run(self.dispatcher.run_once())

    @rule()
    def restart(self) -> None:
        """The instance disappears without shutdown (kill -9); a new one starts."""
        self.dispatcher = self._dispatcher()

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def slots_match_live_jobs_and_terminal_jobs_never_change(self) -> None:
        rows = [self.run(self.store.get(job_id)) for job_id in self.ids]
        for key in KEYS:
            mine = [r for r in rows if r.key_id == key]
            held = sum(1 for r in mine if r.holds_slot)
            live = sum(1 for r in mine if r.status in ACTIVE)
            assert held == live <= SLOTS, (key, held, live)
        for row in rows:
            if row.terminal:
                seen = (row.status, row.output, row.error, row.finished_at)
                assert self.terminal.setdefault(row.id, seen) == seen, row.id
            else:
                assert row.id not in self.terminal, f"{row.id} left a terminal state"

    @invariant()
    def no_double_submission_and_no_false_loss(self) -> None:
        assert all(n == 1 for n in self.remote.submits.values()), self.remote.submits
        for job_id in self.ids:
            row = self.run(self.store.get(job_id))
            if row.error is not None and row.error["code"] == "lost_contact":
                assert row.remote_id is not None
                answered = self.remote.last_answer[row.remote_id]
                assert row.finished_at - answered > BOUND, "failed while the remote answered"


JobsMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJobsStateMachine = JobsMachine.TestCase

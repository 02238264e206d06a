"""The job dispatcher against the RunPod-compatible simulator, with time on a ManualClock:
a 25-minute job or a 10-minute outage takes a fraction of a second. The simulator and
Ballast share the clock; the database is a real (SQLite) file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ballast.config import JobBackendSettings, JobBreakerSettings, JobsSettings
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import Job, JobStore, SlotsFull
from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import ManualClock
from ballast.sim.jobs import SIM_JOBS, JobsSim
from ballast.sim.server import SimServer, start_sim
from ballast.state.db import Database


@dataclass
class Rig:
    clock: ManualClock
    sim: SimServer
    remote: JobsSim
    store: JobStore
    dispatcher: Dispatcher
    history: dict[str, list[str]]

    async def submit(self, payload: Any = None, key: str = "k1", slots: int | None = None) -> Job:
        return await self.store.create(key, "gpu", payload or {}, slots, 100)

    async def run_for(self, seconds: float, step: float = 10.0) -> None:
        """Advance time in steps, letting the dispatcher work after each one."""
        elapsed = 0.0
        while elapsed < seconds:
            self.clock.advance(step)
            elapsed += step
            await self.dispatcher.run_once()
            await self.observe()

    async def observe(self) -> None:
        for job_id in self.history:
            job = await self.store.get(job_id)
            assert job is not None
            self.history[job_id].append(job.public()["status"])

    async def job(self, job_id: str) -> Job:
        job = await self.store.get(job_id)
        assert job is not None
        return job

    def track(self, job: Job) -> Job:
        self.history[job.id] = []
        return job


def backend_settings(url: str, **overrides: Any) -> JobBackendSettings:
    options: dict[str, Any] = {
        "protocol": "runpod",
        "url": url,
        "execution_timeout": 3600.0,
        "typical_duration": 600.0,
        "poll_interval": 5.0,
        "max_poll_interval": 30.0,
        "request_timeout": 0.15,
        "lost_contact_timeout": 600.0,
        "breaker": JobBreakerSettings(failure_threshold=3, open_time=10.0, probe_timeout=120.0),
    }
    options.update(overrides)
    return JobBackendSettings(**options)


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[tuple[Database, SimServer, Dispatcher]] = []

    async def make(**overrides: Any) -> Rig:
        clock = ManualClock()
        sim = await start_sim()
        remote = sim.app[SIM_JOBS]
        remote.clock = clock
        db = Database(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
        await db.upgrade()
        store = JobStore(db, clock, lease_time=30.0)
        settings = JobsSettings(backends={"gpu": backend_settings(sim.url, **overrides)})
        dispatcher = Dispatcher(settings, store, clock, owner="unit")
        made.append((db, sim, dispatcher))
        return Rig(clock, sim, remote, store, dispatcher, {})

    yield make
    for db, sim, dispatcher in made:
        remote = sim.app[SIM_JOBS]
        remote.hang_jobs.clear()
        remote.unreachable_until = 0.0
        await dispatcher.close()
        await sim.close()
        await db.close()


async def test_a_25_minute_job_answering_in_progress_is_never_failed_and_succeeds(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    job = rig.track(await rig.submit({"sim": {"duration": 1500, "queue": 20}}))
    await rig.run_for(1490)
    assert set(rig.history[job.id]) == {"queued", "running"}, "never failed while alive"
    running = await rig.job(job.id)
    assert running.status == "running" and running.progress == pytest.approx(0.98)
    await rig.run_for(90)  # the remote finishes at 1530 s; polls are <= 36 s apart
    done = await rig.job(job.id)
    assert done.status == "succeeded"
    assert done.output == {"echo": {"sim": {"duration": 1500, "queue": 20}}}
    assert done.progress == 1.0 and not done.holds_slot
    assert len(rig.remote.calls("run")) == 1
    assert len(rig.remote.calls("status", done.remote_id)) > 30  # polled all along


async def test_remote_failed_and_timed_out_fail_the_job_at_once_with_the_reason(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig(execution_timeout=600.0, poll_interval=5.0, max_poll_interval=5.0)
    failing = await rig.submit({"sim": {"duration": 100, "outcome": "FAILED", "error": "CUDA OOM"}})
    slow = await rig.submit({"sim": {"duration": 1500}})  # longer than the remote allows
    await rig.run_for(110, step=5)
    failed = await rig.job(failing.id)
    assert failed.status == "failed"
    assert failed.error == {"message": "CUDA OOM", "code": "remote_failed"}
    assert failed.finished_at is not None and failed.finished_at <= rig.clock.time()
    assert (await rig.job(slow.id)).status == "running"
    await rig.run_for(500, step=5)  # 610 s in: the remote's 600 s limit has passed
    timed_out = await rig.job(slow.id)
    assert timed_out.status == "failed"
    assert timed_out.error is not None and timed_out.error["code"] == "remote_timeout"
    assert "timed the job out" in timed_out.error["message"]
    assert timed_out.remote_status == "TIMED_OUT"
    assert await rig.store.slots_held("k1") == 0


@pytest.mark.parametrize("mode", ["503", "hang", "reset"])
async def test_unreachable_for_less_than_the_bound_then_back_the_job_succeeds(
    make_rig: Any, mode: str
) -> None:
    rig: Rig = await make_rig()
    job = rig.track(await rig.submit({"sim": {"duration": 1200}}))
    await rig.run_for(60)
    rig.remote.unreachable_for(550, mode)  # 9 minutes of silence, bound is 10
    await rig.run_for(540, step=54)
    silent = await rig.job(job.id)
    assert silent.status == "running"
    assert silent.last_contact_at is not None
    assert rig.clock.time() - silent.last_contact_at >= 500
    await rig.run_for(700, step=30)
    done = await rig.job(job.id)
    assert done.status == "succeeded"
    assert "failed" not in rig.history[job.id]
    assert rig.remote.calls("cancel") == []


async def test_unreachable_for_longer_than_the_bound_fails_as_lost_contact(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    job = await rig.submit({"sim": {"duration": 3000}}, slots=1)
    await rig.run_for(60)
    rig.remote.unreachable_for(2000, "503")
    await rig.run_for(570, step=30)
    assert (await rig.job(job.id)).status == "running"  # 570 s < 600 s
    await rig.run_for(90, step=30)
    lost = await rig.job(job.id)
    assert lost.status == "failed"
    assert lost.error is not None and lost.error["code"] == "lost_contact"
    assert not lost.holds_slot and await rig.store.slots_held("k1") == 0
    await rig.submit({}, slots=1)  # the slot is really free again
    assert [c["id"] for c in rig.remote.calls("cancel")] == [lost.remote_id]


async def test_a_hung_half_open_trial_frees_its_lease_after_probe_timeout(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig(
        breaker=JobBreakerSettings(failure_threshold=1, open_time=10.0, probe_timeout=120.0)
    )
    breaker = rig.dispatcher.breakers["gpu"]
    rig.remote.run_failures = 1
    trial = await rig.submit({"sim": {"duration": 100}})
    await rig.run_for(1, step=1)
    assert breaker.state is BreakerState.OPEN and (await rig.job(trial.id)).remote_id is None
    await rig.run_for(12, step=1)  # half-open: the held job goes through as the trial
    trial_row = await rig.job(trial.id)
    assert trial_row.remote_id is not None and len(rig.remote.calls("run")) == 2
    rig.remote.hang_jobs.add(trial_row.remote_id)  # its status never answers
    held = await rig.submit({"sim": {"duration": 10}})
    await rig.run_for(100, step=10)
    assert (await rig.job(held.id)).remote_id is None, "held while the trial is in flight"
    assert len(rig.remote.calls("run")) == 2
    await rig.run_for(40, step=10)  # past probe_timeout: the trial's lease has freed itself
    assert (await rig.job(held.id)).remote_id is not None
    assert len(rig.remote.calls("run")) == 3
    await rig.run_for(60, step=10)
    assert (await rig.job(held.id)).status == "succeeded"
    assert breaker.state is BreakerState.CLOSED  # type: ignore[comparison-overlap]
    assert (await rig.job(trial.id)).status == "queued"  # no answer yet, not judged lost


async def test_an_unknown_remote_status_is_alive_never_terminal(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    job = rig.track(await rig.submit({"sim": {"duration": 1200, "status": "WARMING_UP"}}))
    await rig.run_for(1190, step=20)
    alive = await rig.job(job.id)
    assert alive.remote_status == "WARMING_UP" and alive.status in ("queued", "running")
    assert alive.last_contact_at is not None and rig.clock.time() - alive.last_contact_at < 60
    assert "failed" not in rig.history[job.id]
    await rig.run_for(60, step=20)
    assert (await rig.job(job.id)).status == "succeeded"


async def test_404_after_the_retention_window_means_result_expired(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    job = await rig.submit({"sim": {"duration": 60}})
    await rig.run_for(10)
    assert (await rig.job(job.id)).status in ("queued", "running")
    rig.clock.advance(2 * 3600)  # every instance was down for two hours
    await rig.dispatcher.run_once()
    expired = await rig.job(job.id)
    assert expired.status == "failed"
    assert expired.error is not None and expired.error["code"] == "result_expired"
    assert await rig.store.slots_held("k1") == 0


async def test_cancel_shows_cancelling_until_the_backend_confirms(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    rig.remote.cancel_delay = 45.0
    job = await rig.submit({"sim": {"duration": 1000}})
    await rig.run_for(30)
    asked = await rig.store.request_cancel(job.id, "k1")
    assert asked is not None and asked.public()["status"] == "cancelling"
    await rig.run_for(30)
    still = await rig.job(job.id)
    assert still.public()["status"] == "cancelling" and still.holds_slot
    assert rig.remote.calls("cancel")
    await rig.run_for(30)
    done = await rig.job(job.id)
    assert done.public()["status"] == "cancelled" and not done.holds_slot
    assert done.remote_status == "CANCELLED"


async def test_cancel_of_a_held_job_is_immediate_and_it_is_never_submitted(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    job = await rig.submit({})
    cancelled = await rig.store.request_cancel(job.id, "k1")
    assert cancelled is not None and cancelled.public()["status"] == "cancelled"
    await rig.run_for(30)
    assert rig.remote.calls("run") == []
    assert await rig.store.request_cancel(job.id, "other-key") is None


async def test_status_429_is_honoured_and_counts_as_contact(make_rig: Any) -> None:
    rig: Rig = await make_rig(lost_contact_timeout=100.0)
    rig.remote.retry_after = 60
    job = await rig.submit({"sim": {"duration": 500}})
    await rig.run_for(30)
    rig.remote.status_429 = 4
    polls_before = len(rig.remote.calls("status"))
    await rig.run_for(200, step=10)
    row = await rig.job(job.id)
    assert row.status == "running", "429 is an answer, not lost contact"
    assert len(rig.remote.calls("status")) - polls_before <= 5  # waited Retry-After each time
    await rig.run_for(400, step=10)
    assert (await rig.job(job.id)).status == "succeeded"


async def test_backend_progress_is_used_and_the_estimate_is_capped(make_rig: Any) -> None:
    rig: Rig = await make_rig(typical_duration=100.0)
    reported = await rig.submit({"sim": {"duration": 1000, "progress": True}})
    estimated = await rig.submit({"sim": {"duration": 1000}})
    await rig.run_for(500, step=10)
    assert (await rig.job(reported.id)).progress == pytest.approx(0.5, abs=0.06)
    assert (await rig.job(estimated.id)).progress == 0.98
    await rig.run_for(600, step=10)
    assert (await rig.job(estimated.id)).progress == 1.0


async def test_slots_are_taken_at_submission_and_freed_by_every_terminal_state(
    make_rig: Any,
) -> None:
    rig: Rig = await make_rig()
    first = await rig.submit({"sim": {"duration": 30}}, slots=2)
    await rig.submit({"sim": {"duration": 30, "outcome": "FAILED"}}, slots=2)
    with pytest.raises(SlotsFull):
        await rig.submit({}, slots=2)
    assert await rig.submit({}, key="k2", slots=2)  # per key
    await rig.run_for(60)
    assert (await rig.job(first.id)).status == "succeeded"
    assert await rig.store.slots_held("k1") == 0
    await rig.submit({}, slots=2)


async def test_an_interrupted_submission_is_never_resubmitted_blindly(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    job = await rig.submit({})
    # An instance wrote `submitting`, then died before it could store the remote id.
    assert await rig.store.claim("dead", 30.0, 10, ["gpu"], set())
    assert await rig.store.begin_submit(job.id, "dead")
    await rig.run_for(60)
    row = await rig.job(job.id)
    assert row.status == "failed" and row.error is not None
    assert row.error["code"] == "submission_interrupted"
    assert rig.remote.calls("run") == [] and row.submissions == 1


async def test_restart_resumes_polling_from_the_stored_remote_id(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    job = await rig.submit({"sim": {"duration": 300}})
    await rig.run_for(60)
    remote_id = (await rig.job(job.id)).remote_id
    # The first instance vanishes without shutdown; a new one starts on the same database.
    successor = Dispatcher(rig.dispatcher.settings, rig.store, rig.clock, owner="successor")
    try:
        rig.clock.advance(10)
        await successor.run_once()
        assert (await rig.job(job.id)).lease_owner == "unit", "the lease is still live"
        for _ in range(40):
            rig.clock.advance(10)
            await successor.run_once()
        done = await rig.job(job.id)
        assert done.status == "succeeded" and done.remote_id == remote_id
        assert len(rig.remote.calls("run")) == 1
    finally:
        await successor.close()

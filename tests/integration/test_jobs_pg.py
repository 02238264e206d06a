"""Jobs on real PostgreSQL with several instances: leases claimed with FOR UPDATE SKIP LOCKED,
adoption of a killed instance's jobs, and polls only from the lease holder. The backend is
the simulator's RunPod-compatible one, with short real durations."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ballast.config import JobsSettings
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import Job, JobStore
from ballast.sim.jobs import SIM_JOBS
from ballast.sim.server import SimServer, start_sim
from ballast.state.db import Database

pytestmark = pytest.mark.integration

VICTIM = """
import asyncio, json, sys
from ballast.config import JobsSettings
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import JobStore
from ballast.state.db import Database

async def main() -> None:
    settings = JobsSettings.model_validate(json.loads(sys.argv[2]))
    db = Database(sys.argv[1])
    Dispatcher(settings, JobStore(db, lease_time=settings.lease_time), owner="victim").start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def jobs_settings(sim: SimServer, backend: str, **extra: Any) -> JobsSettings:
    return JobsSettings.model_validate(
        {
            "backends": {
                backend: {
                    "protocol": "runpod",
                    "url": sim.url,
                    "poll_interval": 0.05,
                    "max_poll_interval": 0.1,
                    "request_timeout": 2.0,
                    "lost_contact_timeout": 60.0,
                }
            },
            "lease_time": 1.0,
            "claim_interval": 0.02,
            **extra,
        }
    )


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = await start_sim()
    yield server
    await server.close()


async def wait_for(store: JobStore, ids: list[str], timeout: float = 15.0) -> list[Job]:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while True:
        jobs = [await store.get(job_id) for job_id in ids]
        if all(j is not None and j.terminal for j in jobs):
            return [j for j in jobs if j is not None]
        assert time.monotonic() < deadline, [j.public() if j else None for j in jobs]
        await asyncio.sleep(0.05)


async def test_a_killed_instance_s_job_is_adopted_and_submitted_exactly_once(
    database: Database, database_url: str, sim: SimServer
) -> None:
    remote = sim.app[SIM_JOBS]
    remote.default_duration = 2.0
    backend = "gpu-" + uuid.uuid4().hex[:8]
    settings = jobs_settings(sim, backend)
    store = JobStore(database, lease_time=settings.lease_time)
    job = await store.create("k-" + backend, backend, {"prompt": "x"}, 1, 10)
    victim = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        VICTIM,
        database_url,
        settings.model_dump_json(),
        stdout=asyncio.subprocess.DEVNULL,
    )
    heir: Dispatcher | None = None
    try:
        deadline = time.monotonic() + 15
        while not [c for c in remote.calls("status") if c["instance"] == "victim"]:
            assert victim.returncode is None and time.monotonic() < deadline
            await asyncio.sleep(0.02)
        owned = await store.get(job.id)
        # Submitted by the victim; its status may still say queued, as the remote does.
        assert owned is not None and owned.lease_owner == "victim"
        assert owned.submissions == 1 and owned.submitted_at is not None
        os.kill(victim.pid, signal.SIGKILL)  # no shutdown, no lease hand-back
        await asyncio.wait_for(victim.wait(), 5)
        killed_at = len(remote.log)
        heir = Dispatcher(settings, store, owner="heir")
        heir.start()
        [done] = await wait_for(store, [job.id])
        assert done.status == "succeeded" and done.output == {"echo": {"prompt": "x"}}
        assert len(remote.calls("run")) == 1 and done.submissions == 1
        after = [c for c in remote.log[killed_at:] if c["op"] == "status"]
        assert after and {c["instance"] for c in after} == {"heir"}
        assert await store.slots_held("k-" + backend) == 0
    finally:
        if victim.returncode is None:
            victim.kill()
            await asyncio.wait_for(victim.wait(), 5)
        if heir is not None:
            await heir.close()


async def test_two_instances_every_poll_comes_from_the_lease_holder(
    database: Database, sim: SimServer
) -> None:
    remote = sim.app[SIM_JOBS]
    remote.default_duration = 0.6
    backend = "gpu-" + uuid.uuid4().hex[:8]
    settings = jobs_settings(sim, backend, max_in_flight=2)
    stores = [JobStore(database, lease_time=settings.lease_time) for _ in range(2)]
    instances = [Dispatcher(settings, s, owner=f"inst-{i}") for i, s in enumerate(stores)]
    ids = [
        (await stores[0].create("k-" + backend, backend, {"n": n}, None, 100)).id for n in range(10)
    ]
    for instance in instances:
        instance.start()
    try:
        jobs = await wait_for(stores[0], ids)
    finally:
        for instance in instances:
            await instance.close()
    assert all(j.status == "succeeded" and j.submissions == 1 for j in jobs)
    assert len(remote.calls("run")) == 10
    submitter = {c["id"]: c["instance"] for c in remote.calls("run")}
    for job in jobs:
        polls = remote.calls("status", job.remote_id)
        assert polls and {c["instance"] for c in polls} == {submitter[job.remote_id]}, json.dumps(
            polls
        )
    assert set(submitter.values()) == {"inst-0", "inst-1"}, "both instances claimed work"

"""The dispatcher: claims due jobs under a lease, submits them behind the backend's breaker
and polls them until the remote gives a verdict.

The side that owns the work owns its timeout (seed 004). A queued/running answer, or any
status word we do not know, is a heartbeat: the job lives on however long it runs. An
explicit remote failure or remote timeout fails it at once with the remote's reason. Only
contact lost for longer than `lost_contact_timeout` fails it locally, and then a remote
cancel is still attempted. The breaker counts submission and infrastructure failures only;
a half-open trial's verdict is its first status answer, and a trial that gets none frees
its lease after `probe_timeout`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from typing import Any

from ballast.config import JobBackendSettings, JobsSettings, breaker_config
from ballast.jobs.backends import build
from ballast.jobs.backends.base import (
    JobBackend,
    NotFound,
    RateLimited,
    Rejected,
    Remote,
    Unreachable,
)
from ballast.jobs.progress import estimate
from ballast.jobs.store import Job, JobStore
from ballast.resilience.backoff import Backoff
from ballast.resilience.breaker import CircuitBreaker, Permit
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline

log = logging.getLogger("ballast.jobs")

SHUTDOWN_GRACE = 5.0
# A running job's status polls space out by this factor from poll_interval up to
# max_poll_interval, each drawn from the last 20% below that (never sooner than 80% of it).
POLL_GROWTH = 1.5
POLL_JITTER = 0.2


def poll_backoff(settings: JobBackendSettings) -> Backoff:
    return Backoff(
        settings.poll_interval, settings.max_poll_interval, factor=POLL_GROWTH, jitter=POLL_JITTER
    )


class Dispatcher:
    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        clock: Clock = SYSTEM_CLOCK,
        backends: dict[str, JobBackend] | None = None,
        owner: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.owner = owner or "inst-" + uuid.uuid4().hex[:16]
        self.rng = rng or random.Random()
        self.backends: dict[str, JobBackend] = backends or {
            name: build(name, conf, self.owner) for name, conf in settings.backends.items()
        }
        self.breakers = {
            name: CircuitBreaker(f"jobs:{name}", breaker_config(b.settings.breaker), clock)
            for name, b in self.backends.items()
        }
        self._trials: dict[str, Permit] = {}  # job id -> half-open permit awaiting a verdict
        self._trial_of: dict[str, str] = {}  # job id -> its backend
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._last_renew = -1e18

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except Exception:
                log.exception("jobs: dispatcher tick failed; retrying")
            clock = self.clock
            with (
                contextlib.suppress(TimeoutError),
                Deadline(clock, clock.monotonic() + self.settings.claim_interval),
            ):
                await self._wake.wait()
            self._wake.clear()

    async def close(self) -> None:
        """Stop claiming, let in-flight steps write their results (bounded), then hand every
        lease back so another instance takes over at once."""
        self._stopping = True
        self._wake.set()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        pending = list(self._inflight.values())
        if pending:
            with (
                contextlib.suppress(TimeoutError),
                Deadline(self.clock, self.clock.monotonic() + SHUTDOWN_GRACE),
            ):
                await asyncio.wait(pending)
            late = [task for task in pending if not task.done()]
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for job_id, permit in list(self._trials.items()):
            name = self._trial_of.get(job_id)
            if name is not None:
                self.breakers[name].release(permit)
        self._trials.clear()
        self._trial_of.clear()
        try:
            await self.store.release_leases(self.owner)
        except Exception:
            log.warning("jobs: could not hand back leases; they expire on their own")
        for backend in self.backends.values():
            await backend.close()

    # -- one round ----------------------------------------------------------------------

    async def tick(self) -> None:
        """Renew this instance's leases, claim due jobs and start a step for each."""
        now = self.clock.monotonic()
        lease = self.settings.lease_time
        if now - self._last_renew >= lease / 3:
            await self.store.renew(self.owner, lease)
            self._last_renew = now
        room = self.settings.max_in_flight - len(self._inflight)
        claimed = await self.store.claim(
            self.owner, lease, room, list(self.backends), set(self._inflight)
        )
        for job in claimed:
            task = asyncio.get_running_loop().create_task(self._step_safely(job))
            self._inflight[job.id] = task
            task.add_done_callback(self._done(job.id))

    def _done(self, job_id: str) -> Any:
        def forget(_: asyncio.Task[None]) -> None:
            self._inflight.pop(job_id, None)

        return forget

    async def run_once(self) -> None:
        """One tick and every step it started (tests drive time with this)."""
        await self.tick()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def _step_safely(self, job: Job) -> None:
        try:
            await self.step(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("jobs: step for %s failed", job.id)

    async def step(self, job: Job) -> None:
        if job.remote_id is None:
            if job.status == "submitting":
                # Its submitter died between writing `submitting` and the remote id: the
                # remote may or may not have it. Never resubmit blindly.
                await self.store.finish(
                    job.id,
                    self.owner,
                    "failed",
                    error=(
                        "The instance submitting this job stopped mid-submission; it was "
                        "not resubmitted to avoid running it twice.",
                        "submission_interrupted",
                    ),
                )
                return
            await self._submit(job)
            return
        if job.cancel_requested:
            await self._send_cancel(job)
        await self._poll(job)

    # -- submission ---------------------------------------------------------------------

    def _next_poll(self, job: Job, backend: JobBackend, polls: int | None = None) -> float:
        n = job.polls if polls is None else polls
        if job.cancel_requested:
            n = 0  # a cancellation is followed closely
        return self.clock.time() + poll_backoff(backend.settings).delay(n, self.rng)

    async def _submit(self, job: Job) -> None:
        backend = self.backends[job.backend]
        breaker = self.breakers[job.backend]
        permit = breaker.acquire()
        if permit is None:
            # Held as queued until the breaker admits a trial (open, or a trial in flight).
            wait = max(self.settings.claim_interval, breaker.retry_after())
            await self.store.defer(job.id, self.owner, self.clock.time() + wait)
            return
        if not await self.store.begin_submit(job.id, self.owner):
            breaker.release(permit)
            return
        try:
            remote = await backend.submit(job.id, job.input)
        except asyncio.CancelledError:
            breaker.release(permit)
            raise
        except (Unreachable, RateLimited) as exc:
            hint = exc.retry_after if isinstance(exc, RateLimited) else None
            breaker.record_failure(permit, hint)
            if isinstance(exc, Unreachable) and exc.maybe_sent:
                await self.store.finish(
                    job.id,
                    self.owner,
                    "failed",
                    error=(
                        "The backend did not confirm the submission; it was not resubmitted "
                        "to avoid running it twice.",
                        "submission_unknown",
                    ),
                )
                return
            delay = max(hint or 0.0, backend.settings.poll_interval, breaker.retry_after())
            await self.store.requeue(job.id, self.owner, self.clock.time() + delay)
            log.warning("jobs: submission to %s failed (%s); held", job.backend, exc)
            return
        except (Rejected, NotFound) as exc:
            if isinstance(exc, NotFound):
                breaker.record_failure(permit)
            else:
                breaker.record_success(permit)  # it answered: the backend is up
            await self.store.finish(
                job.id,
                self.owner,
                "failed",
                error=(f"The backend refused the job: {str(exc)[:500]}", "backend_rejected"),
            )
            return
        assert remote.remote_id is not None
        if permit.probe:
            self._trials[job.id] = permit  # the verdict is the first status answer
            self._trial_of[job.id] = job.backend
        else:
            breaker.record_success(permit)
        status = "queued" if remote.state == "queued" else "running"
        written = await self.store.submitted(
            job.id,
            self.owner,
            remote.remote_id,
            remote.raw,
            status,
            self._next_poll(job, backend, 0),
        )
        if written and remote.state in ("succeeded", "failed", "cancelled"):
            fresh = await self.store.get(job.id)
            if fresh is not None:
                await self._verdict(fresh, backend, remote)

    # -- polling ------------------------------------------------------------------------

    async def _poll(self, job: Job) -> None:
        backend = self.backends[job.backend]
        assert job.remote_id is not None
        try:
            remote = await backend.status(job.remote_id)
        except RateLimited as limited:
            # An answer all the same: the backend is there, it asks us to slow down.
            wait = max(limited.retry_after or 0.0, backend.settings.poll_interval)
            await self.store.heartbeat(
                job,
                self.owner,
                job.status if job.status != "submitting" else "queued",
                job.remote_status or "",
                job.progress,
                self.clock.time() + wait * self.rng.uniform(1.0, 1.2),
            )
            return
        except NotFound:
            age = self.clock.time() - (job.submitted_at or job.created_at)
            if age >= backend.settings.retention:
                await self.store.finish(
                    job.id,
                    self.owner,
                    "failed",
                    error=(
                        "The backend no longer keeps this job's result (retention window passed).",
                        "result_expired",
                    ),
                )
                return
            await self._lost(job, backend, "not found")
            return
        except (Unreachable, Rejected) as exc:
            await self._lost(job, backend, str(exc))
            return
        self._settle_trial(job, success=True)
        await self._verdict(job, backend, remote)

    def _settle_trial(self, job: Job, success: bool) -> None:
        permit = self._trials.pop(job.id, None)
        name = self._trial_of.pop(job.id, None)
        if permit is None or name is None:
            return
        if success:
            self.breakers[name].record_success(permit)
        else:
            self.breakers[name].record_failure(permit)

    async def _lost(self, job: Job, backend: JobBackend, reason: str) -> None:
        """No answer. Only contact lost for longer than the bound fails the job."""
        breaker = self.breakers[job.backend]
        if job.id not in self._trials:
            permit = breaker.acquire()
            if permit is not None and not permit.probe:
                breaker.record_failure(permit)  # an infrastructure failure, counted once
            elif permit is not None:
                breaker.release(permit)
        since = job.last_contact_at or job.submitted_at or job.created_at
        silent = self.clock.time() - since
        if silent <= backend.settings.lost_contact_timeout:
            await self.store.no_contact(job.id, self.owner, self._next_poll(job, backend))
            return
        finished = await self.store.finish(
            job.id,
            self.owner,
            "failed",
            error=(
                f"Lost contact with the backend for {silent:.0f}s "
                f"(bound {backend.settings.lost_contact_timeout:.0f}s): {reason[:200]}",
                "lost_contact",
            ),
        )
        self._trials.pop(job.id, None)
        self._trial_of.pop(job.id, None)
        if finished and job.remote_id is not None:
            with contextlib.suppress(Exception):
                await backend.cancel(job.remote_id)  # best effort: do not burn the GPU

    async def _send_cancel(self, job: Job) -> None:
        assert job.remote_id is not None
        with contextlib.suppress(Exception):
            await self.backends[job.backend].cancel(job.remote_id)

    async def _verdict(self, job: Job, backend: JobBackend, remote: Remote) -> None:
        now = self.clock.time()
        if remote.state == "succeeded":
            await self.store.finish(
                job.id,
                self.owner,
                "succeeded",
                remote_status=remote.raw,
                output=remote.output,
                progress=1.0,
                contact=True,
            )
        elif remote.state == "failed":
            code = "remote_timeout" if remote.raw == "TIMED_OUT" else "remote_failed"
            await self.store.finish(
                job.id,
                self.owner,
                "failed",
                remote_status=remote.raw,
                error=(remote.error or "The backend reported a failure.", code),
                contact=True,
            )
        elif remote.state == "cancelled":
            await self.store.finish(
                job.id, self.owner, "cancelled", remote_status=remote.raw, contact=True
            )
        else:
            # queued, running, or a word we do not know: alive, whatever the elapsed time.
            status = {"queued": "queued", "running": "running"}.get(remote.state, job.status)
            if status == "submitting":
                status = "running"
            progress = estimate(
                remote.progress,
                status,
                job.submitted_at,
                now,
                backend.settings.typical_duration,
                job.progress,
            )
            await self.store.heartbeat(
                job, self.owner, status, remote.raw, progress, self._next_poll(job, backend)
            )

    def status(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "in_flight": len(self._inflight),
            "breakers": {name: b.snapshot() for name, b in self.breakers.items()},
        }

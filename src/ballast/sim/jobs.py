"""A RunPod-compatible serverless job backend: ``POST /run``, ``GET /status/{id}``,
``POST /cancel/{id}``, answering IN_QUEUE, IN_PROGRESS, COMPLETED, FAILED, CANCELLED and
TIMED_OUT like the real one (the remote owns the execution timeout, `policy.executionTimeout`).

A job's input may steer it: ``{"sim": {"duration": 1500, "queue": 5, "outcome": "FAILED",
"error": "...", "output": ..., "progress": true, "status": "WARMING_UP"}}`` (``status`` is an
unknown word answered while it runs). Faults for every job: unreachability windows (503,
hang or reset), 429s on ``/status`` and 503s on ``/run``; set them with ``PUT /sim/jobs`` or
on :class:`JobsSim` directly. Time comes from an injectable clock, so a 25-minute job can
run in milliseconds of a test. ``GET /sim/jobs`` shows the jobs and a log of every call."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web


class Clock(Protocol):
    """The simulator's own view of time (it uses none of the gateway's code): anything with
    a monotonic reading, such as a test's manual clock."""

    def monotonic(self) -> float: ...


class _SystemClock:
    monotonic = staticmethod(time.monotonic)


SYSTEM_CLOCK: Clock = _SystemClock()

UNREACHABLE_MODES = ("503", "hang", "reset")
HANG_POLL = 0.02


@dataclass
class SimJob:
    id: str
    input: Any
    created: float
    queue: float
    duration: float
    outcome: str = "COMPLETED"
    error: str | None = None
    output: Any = None
    progress: bool = False
    running_word: str = "IN_PROGRESS"
    execution_timeout: float | None = None
    cancel_at: float | None = None
    finished_at: float | None = None

    def status(self, now: float) -> str:
        start = self.created + self.queue
        if self.cancel_at is not None and now >= self.cancel_at:
            return self._end("CANCELLED", self.cancel_at)
        if now < start:
            return "IN_QUEUE"
        limit = self.execution_timeout
        if limit is not None and self.duration > limit and now >= start + limit:
            return self._end("TIMED_OUT", start + limit)
        if now < start + self.duration:
            return self.running_word
        return self._end(self.outcome, start + self.duration)

    def _end(self, word: str, at: float) -> str:
        if self.finished_at is None:
            self.finished_at = at
        return word


@dataclass
class JobsSim:
    clock: Clock = SYSTEM_CLOCK
    default_duration: float = 2.0
    default_queue: float = 0.0
    retention: float = 1800.0
    cancel_delay: float = 0.0
    status_429: int = 0
    retry_after: float = 1.0
    run_failures: int = 0
    unreachable_until: float = 0.0
    unreachable_mode: str = "503"
    hang_jobs: set[str] = field(default_factory=set)  # /status of these never answers
    jobs: dict[str, SimJob] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def unreachable_for(self, seconds: float, mode: str = "503") -> None:
        if mode not in UNREACHABLE_MODES:
            raise ValueError(f"mode must be one of {', '.join(UNREACHABLE_MODES)}")
        self.unreachable_until = self.clock.monotonic() + seconds
        self.unreachable_mode = mode

    def unreachable(self) -> bool:
        return self.clock.monotonic() < self.unreachable_until

    def calls(self, op: str, job_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.log if e["op"] == op and (job_id is None or e["id"] == job_id)]

    def answer(self, job: SimJob) -> dict[str, Any]:
        now = self.clock.monotonic()
        word = job.status(now)
        body: dict[str, Any] = {"id": job.id, "status": word}
        if word == "COMPLETED":
            body["output"] = job.output if job.output is not None else {"echo": job.input}
        elif word in ("FAILED", "TIMED_OUT"):
            body["error"] = job.error or ("execution timeout" if word == "TIMED_OUT" else "boom")
        elif word == "IN_PROGRESS" and job.progress:
            start = job.created + job.queue
            body["output"] = {"progress": round(min(1.0, (now - start) / job.duration), 4)}
        return body

    def expired(self, job: SimJob) -> bool:
        job.status(self.clock.monotonic())
        return (
            job.finished_at is not None
            and self.clock.monotonic() > job.finished_at + self.retention
        )


SIM_JOBS = web.AppKey("sim_jobs", JobsSim)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _reset(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


async def _fault(request: web.Request, sim: JobsSim) -> web.Response | None:
    """While unreachable: 503, a reset, or a hang until the window ends or the client goes."""
    if not sim.unreachable():
        return None
    if sim.unreachable_mode == "503":
        return _json({"error": "service unavailable"}, 503)
    if sim.unreachable_mode == "reset":
        _reset(request)
        raise asyncio.CancelledError
    while sim.unreachable():
        transport = request.transport
        if transport is None or transport.is_closing():
            raise asyncio.CancelledError
        await asyncio.sleep(HANG_POLL)
    return None


def _record(request: web.Request, sim: JobsSim, op: str, job_id: str | None) -> None:
    sim.log.append(
        {
            "op": op,
            "id": job_id,
            "instance": request.headers.get("x-ballast-instance"),
            "at": sim.clock.monotonic(),
        }
    )


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


async def _run(request: web.Request) -> web.Response:
    sim = request.app[SIM_JOBS]
    _record(request, sim, "run", None)
    fault = await _fault(request, sim)
    if fault is not None:
        return fault
    if sim.run_failures > 0:
        sim.run_failures -= 1
        return _json({"error": "no workers available"}, 503)
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _json({"error": "body must be JSON"}, 400)
    if not isinstance(body, dict) or "input" not in body:
        return _json({"error": "'input' is required"}, 400)
    payload = body["input"]
    steer = payload.get("sim") if isinstance(payload, dict) else None
    steer = steer if isinstance(steer, dict) else {}
    policy = body.get("policy") if isinstance(body.get("policy"), dict) else {}
    timeout_ms = policy.get("executionTimeout") if policy else None
    job = SimJob(
        id=f"sim-{next(sim._ids)}",
        input=payload,
        created=sim.clock.monotonic(),
        queue=_number(steer.get("queue"), sim.default_queue),
        duration=_number(steer.get("duration"), sim.default_duration),
        outcome=str(steer.get("outcome", "COMPLETED")),
        error=steer.get("error"),
        output=steer.get("output"),
        progress=bool(steer.get("progress", False)),
        running_word=str(steer.get("status", "IN_PROGRESS")),
        execution_timeout=timeout_ms / 1000.0 if isinstance(timeout_ms, int | float) else None,
    )
    sim.jobs[job.id] = job
    sim.log[-1]["id"] = job.id
    return _json({"id": job.id, "status": "IN_QUEUE"})


async def _status(request: web.Request) -> web.Response:
    sim = request.app[SIM_JOBS]
    job_id = request.match_info["id"]
    _record(request, sim, "status", job_id)
    fault = await _fault(request, sim)
    if fault is not None:
        return fault
    while job_id in sim.hang_jobs:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise asyncio.CancelledError
        await asyncio.sleep(HANG_POLL)
    if sim.status_429 > 0:
        sim.status_429 -= 1
        return _json(
            {"error": "rate limited"}, 429, {"retry-after": str(max(0, round(sim.retry_after)))}
        )
    job = sim.jobs.get(job_id)
    if job is None or sim.expired(job):
        return _json({"error": "request does not exist"}, 404)
    return _json(sim.answer(job))


async def _cancel(request: web.Request) -> web.Response:
    sim = request.app[SIM_JOBS]
    job_id = request.match_info["id"]
    _record(request, sim, "cancel", job_id)
    fault = await _fault(request, sim)
    if fault is not None:
        return fault
    job = sim.jobs.get(job_id)
    if job is None or sim.expired(job):
        return _json({"error": "request does not exist"}, 404)
    now = sim.clock.monotonic()
    if job.cancel_at is None and job.status(now) in ("IN_QUEUE", job.running_word):
        job.cancel_at = now + sim.cancel_delay
    return _json(sim.answer(job))


async def _get_control(request: web.Request) -> web.Response:
    sim = request.app[SIM_JOBS]
    return _json(
        {
            "jobs": {job_id: sim.answer(job) for job_id, job in sim.jobs.items()},
            "log": sim.log,
        }
    )


async def _put_control(request: web.Request) -> web.Response:
    sim = request.app[SIM_JOBS]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _json({"error": "body must be JSON"}, 400)
    if not isinstance(body, dict):
        return _json({"error": "body must be a JSON object"}, 400)
    for name in ("default_duration", "default_queue", "retention", "cancel_delay", "retry_after"):
        if name in body:
            setattr(sim, name, _number(body[name], getattr(sim, name)))
    for name in ("status_429", "run_failures"):
        if name in body:
            setattr(sim, name, int(_number(body[name], 0)))
    if "unreachable_for" in body:
        try:
            sim.unreachable_for(
                _number(body["unreachable_for"], 0.0), str(body.get("unreachable_mode", "503"))
            )
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
    return _json({"ok": True})


def add_job_routes(app: web.Application, clock: Clock = SYSTEM_CLOCK) -> None:
    app[SIM_JOBS] = JobsSim(clock=clock)
    app.router.add_post("/run", _run)
    app.router.add_get("/status/{id}", _status)
    app.router.add_post("/cancel/{id}", _cancel)
    app.router.add_get("/sim/jobs", _get_control)
    app.router.add_put("/sim/jobs", _put_control)

"""The jobs API: `POST /v1/jobs`, `GET /v1/jobs/{id}[?wait=S]`, `GET /v1/jobs`,
`POST /v1/jobs/{id}/cancel`. A key sees only its own jobs (another key's job is a 404)."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import parse_qs

import orjson

from ballast.config import JobsSettings
from ballast.jobs.dispatcher import Dispatcher
from ballast.jobs.store import TERMINAL, Job, JobStore, QueueFull, SlotsFull
from ballast.pipeline.access import MASTER, Access
from ballast.pipeline.asgi import (
    JSON,
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    send_bytes,
    send_error,
)
from ballast.pipeline.errors import ApiError, bad_request
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.keys import KeyRecord

ANONYMOUS = KeyRecord(id="anonymous", name="open mode")
MAX_INPUT_BYTES = 10 * 1024 * 1024
WAIT_SLICE = 0.5  # long polls re-read the row at least this often (other instances' writes)


def job_not_found(job_id: str) -> ApiError:
    return ApiError(
        404, f"No job with id '{job_id[:100]}'.", "invalid_request_error", "job_not_found", "id"
    )


def _query(scope: Scope) -> dict[str, list[str]]:
    raw = scope.get("query_string") or b""
    return parse_qs(raw.decode("latin-1"))


def _number(query: dict[str, list[str]], name: str, default: float) -> float:
    values = query.get(name)
    if not values:
        return default
    try:
        value = float(values[-1])
    except ValueError:
        raise bad_request(f"'{name}' must be a number.", name) from None
    if not math.isfinite(value) or value < 0:
        raise bad_request(f"'{name}' must be a non-negative number.", name)
    return value


class JobsApi:
    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        dispatcher: Dispatcher | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.clock = clock
        self.access: Access | None = None

    async def _key(self, scope: Scope) -> KeyRecord:
        if self.access is None or not await self.access.required():
            return ANONYMOUS
        return await self.access.authenticate(scope)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Everything under /v1/jobs."""
        try:
            await self._route(scope, receive, send)
        except ApiError as error:
            await send_error(send, error, [])
        except ClientGone:
            return

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"].rstrip("/")
        method: str = scope["method"]
        parts = path.split("/")  # ["", "v1", "jobs", id?, "cancel"?]
        if len(parts) == 3:
            if method == "POST":
                await self.submit(scope, receive, send)
            elif method == "GET":
                await self.list(scope, send)
            else:
                raise ApiError(405, f"Method {method} is not allowed on {path}.")
        elif len(parts) == 4 and parts[3]:
            if method != "GET":
                raise ApiError(405, f"Method {method} is not allowed on {path[:200]}.")
            await self.get(scope, send, parts[3])
        elif len(parts) == 5 and parts[3] and parts[4] == "cancel":
            if method != "POST":
                raise ApiError(405, f"Method {method} is not allowed on {path[:200]}.")
            await self.cancel(scope, send, parts[3])
        else:
            raise ApiError(404, f"Unknown path {path[:200]}.", code="not_found")

    async def _reply(self, send: Send, status: int, body: Any) -> None:
        await send_bytes(send, status, [JSON], orjson.dumps(body))

    async def submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = await self._key(scope)
        raw = await read_body(scope, receive, MAX_INPUT_BYTES)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_request('The body must be JSON: {"backend": ..., "input": ...}.') from None
        if not isinstance(body, dict):
            raise bad_request("The body must be a JSON object.")
        backend = body.get("backend")
        if not isinstance(backend, str) or not backend:
            raise bad_request("'backend' is required (a configured job backend).", "backend")
        if "input" not in body:
            raise bad_request("'input' is required.", "input")
        if self.access is not None and key is not ANONYMOUS:
            await self.access.admit_job(key, backend)
        conf = self.settings.backends.get(backend)
        if conf is None or self.dispatcher is None:
            raise ApiError(
                404,
                f"The job backend '{backend[:200]}' does not exist.",
                "invalid_request_error",
                "backend_not_found",
                "backend",
            )
        limit = key.max_concurrent_jobs if key is not MASTER else None
        try:
            job = await self.store.create(key.id, backend, body["input"], limit, conf.max_queued)
        except SlotsFull as full:
            raise ApiError(
                429,
                f"This key already runs {full.limit} jobs, its limit; wait for one to finish.",
                "rate_limit_error",
                "concurrent_jobs_exceeded",
            ) from None
        except QueueFull:
            breaker = self.dispatcher.breakers[backend]
            retry = str(max(1, math.ceil(breaker.retry_after() or conf.poll_interval)))
            raise ApiError(
                503,
                f"The job backend '{backend}' is unavailable and its queue is full.",
                "api_error",
                "jobs_queue_full",
                headers=((b"retry-after", retry.encode()),),
            ) from None
        self.dispatcher.wake()
        await self._reply(send, 202, job.public())

    async def get(self, scope: Scope, send: Send, job_id: str) -> None:
        key = await self._key(scope)
        wait = min(_number(_query(scope), "wait", 0.0), self.settings.max_wait)
        job = await self.store.get(job_id, key.id)
        if job is None:
            raise job_not_found(job_id)
        deadline = self.clock.monotonic() + wait
        while job.status not in TERMINAL:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                break
            await self.store.changed(min(WAIT_SLICE, remaining))
            fresh = await self.store.get(job_id, key.id)
            if fresh is None:
                break
            job = fresh
        await self._reply(send, 200, job.public())

    async def list(self, scope: Scope, send: Send) -> None:
        key = await self._key(scope)
        query = _query(scope)
        limit = int(min(100, max(1, _number(query, "limit", 20))))
        before = _number(query, "before", math.inf)
        statuses = query.get("status")
        status = statuses[-1] if statuses else None
        jobs: list[Job] = await self.store.for_key(
            key.id, limit, before if math.isfinite(before) else None, status
        )
        await self._reply(
            send,
            200,
            {"object": "list", "data": [j.public() for j in jobs], "has_more": len(jobs) == limit},
        )

    async def cancel(self, scope: Scope, send: Send, job_id: str) -> None:
        key = await self._key(scope)
        job = await self.store.request_cancel(job_id, key.id)
        if job is None:
            raise job_not_found(job_id)
        if self.dispatcher is not None and not job.terminal:
            self.dispatcher.wake()
        await self._reply(send, 200, job.public())

"""The RunPod serverless protocol: POST /run, GET /status/{id}, POST /cancel/{id}.
The execution timeout is the remote's (`policy.executionTimeout`, milliseconds)."""

from __future__ import annotations

from typing import Any

from ballast.jobs.backends.base import (
    HttpBackend,
    Remote,
    RemoteState,
    Unreachable,
    fraction,
    remote_of,
)

STATES: dict[str, RemoteState] = {
    "IN_QUEUE": "queued",
    "IN_PROGRESS": "running",
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "TIMED_OUT": "failed",
}


def parse(data: Any) -> Remote:
    if not isinstance(data, dict):
        raise Unreachable("status answer is not an object")
    raw = str(data.get("status", ""))
    state = STATES.get(raw, "alive")
    output = data.get("output")
    error = data.get("error")
    progress = None
    if state == "running" and output is not None:
        # A worker's progress_update shows up as the output of an IN_PROGRESS job.
        progress = fraction(output.get("progress") if isinstance(output, dict) else output)
    message = None
    if raw == "TIMED_OUT":
        message = "The backend timed the job out" + (f": {error}" if error else ".")
    elif state == "failed":
        message = str(error) if error else "The backend reported the job as failed."
    return remote_of(data, state, raw, message, progress)


class RunPodBackend(HttpBackend):
    async def submit(self, job_id: str, payload: Any) -> Remote:
        body: dict[str, Any] = {**self.settings.body, "input": payload}
        if self.settings.execution_timeout is not None:
            body["policy"] = {"executionTimeout": int(self.settings.execution_timeout * 1000)}
        answer = parse(await self.request("POST", "/run", body))
        if not answer.remote_id:
            raise Unreachable("/run answered without an id")
        return answer

    async def status(self, remote_id: str) -> Remote:
        return parse(await self.request("GET", f"/status/{remote_id}"))

    async def cancel(self, remote_id: str) -> Remote | None:
        data = await self.request("POST", f"/cancel/{remote_id}")
        return parse(data) if isinstance(data, dict) and "status" in data else None

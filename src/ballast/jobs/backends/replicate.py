"""The Replicate predictions protocol: POST /predictions, GET /predictions/{id},
POST /predictions/{id}/cancel. The execution timeout goes down as `Cancel-After`."""

from __future__ import annotations

import re
from typing import Any

from ballast.jobs.backends.base import HttpBackend, Remote, RemoteState, Unreachable, remote_of

STATES: dict[str, RemoteState] = {
    "starting": "queued",
    "processing": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "cancelled",
    "aborted": "failed",  # terminated before it started; terminal all the same
}
_PERCENT = re.compile(r"(\d{1,3})%")


def parse(data: Any) -> Remote:
    if not isinstance(data, dict):
        raise Unreachable("prediction is not an object")
    raw = str(data.get("status", ""))
    state = STATES.get(raw, "alive")
    progress = None
    logs = data.get("logs")
    if state == "running" and isinstance(logs, str):
        found = _PERCENT.findall(logs[-2000:])
        if found:
            progress = min(1.0, int(found[-1]) / 100.0)
    error = None
    if state == "failed":
        error = str(data.get("error") or f"The backend reported the prediction as {raw}.")
    return remote_of(data, state, raw, error, progress)


class ReplicateBackend(HttpBackend):
    async def submit(self, job_id: str, payload: Any) -> Remote:
        headers = {}
        if self.settings.execution_timeout is not None:
            headers["cancel-after"] = f"{int(self.settings.execution_timeout)}s"
        body = {**self.settings.body, "input": payload}
        answer = parse(await self.request("POST", "/predictions", body, headers))
        if not answer.remote_id:
            raise Unreachable("/predictions answered without an id")
        return answer

    async def status(self, remote_id: str) -> Remote:
        return parse(await self.request("GET", f"/predictions/{remote_id}"))

    async def cancel(self, remote_id: str) -> Remote | None:
        data = await self.request("POST", f"/predictions/{remote_id}/cancel")
        return parse(data) if isinstance(data, dict) and "status" in data else None

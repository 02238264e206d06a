"""A generic JSON job API: configurable paths and a map from its status words to ours.
Fields read: `id`, `status`, `output`, `error`, `progress`. An unmapped status is alive."""

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

DEFAULT_MAP: dict[str, RemoteState] = {
    "queued": "queued",
    "pending": "queued",
    "starting": "queued",
    "running": "running",
    "processing": "running",
    "succeeded": "succeeded",
    "success": "succeeded",
    "completed": "succeeded",
    "failed": "failed",
    "error": "failed",
    "cancelled": "cancelled",
    "canceled": "cancelled",
}


class GenericHttpBackend(HttpBackend):
    def parse(self, data: Any) -> Remote:
        if not isinstance(data, dict):
            raise Unreachable("job answer is not an object")
        raw = str(data.get("status", ""))
        mapping: dict[str, RemoteState] = {**DEFAULT_MAP, **self.settings.status_map}
        state = mapping.get(raw, "alive")
        error = None
        if state == "failed":
            error = str(data.get("error") or f"The backend reported the job as {raw}.")
        return remote_of(data, state, raw, error, fraction(data.get("progress")))

    async def submit(self, job_id: str, payload: Any) -> Remote:
        body: dict[str, Any] = {**self.settings.body, "input": payload}
        if self.settings.execution_timeout is not None:
            body["execution_timeout"] = self.settings.execution_timeout
        answer = self.parse(await self.request("POST", self.settings.submit_path, body))
        if not answer.remote_id:
            raise Unreachable("submission answered without an id")
        return answer

    async def status(self, remote_id: str) -> Remote:
        return self.parse(
            await self.request("GET", self.settings.status_path.replace("{id}", remote_id))
        )

    async def cancel(self, remote_id: str) -> Remote | None:
        data = await self.request("POST", self.settings.cancel_path.replace("{id}", remote_id))
        return self.parse(data) if isinstance(data, dict) and "status" in data else None

"""The sampling-actor protocol: create a run (with Ballast's durable service session) and
release it. Requests on a run go through the ordinary exchange with the run's Route."""

from __future__ import annotations

import uuid

from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.resilience.handles import Handle, Key
from ballast.state.sessions import SessionStore
from ballast.upstream.client import Upstream


class ActorRuns:
    def __init__(self, upstream: Upstream, sessions: SessionStore) -> None:
        self.upstream = upstream
        self.sessions = sessions

    async def create(self, key: Key, session_id: str | None) -> Handle:
        """A new run on the service session of (credential, model), made once and reused."""
        if session_id is None:
            session_id = await self.sessions.get_or_create(
                key[0], key[1], lambda: f"sess-{uuid.uuid4().hex}"
            )
        url = self.upstream.base_url + "/runs"
        status, data = await self.upstream.call_json(
            "POST", url, {"model": key[1], "session_id": session_id}
        )
        if status not in (200, 201) or not isinstance(data, dict):
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                f"the actor refused a new run ({status})",
                status=status,
                deployment=self.upstream.id,
            )
        try:
            run_id = str(data["run_id"])
            return Handle(
                session_id=session_id,
                run_id=run_id,
                endpoint=f"{self.upstream.base_url}/runs/{run_id}/v1",
                token=str(data["token"]),
                expires_at=float(data["expires_at"]),
            )
        except (KeyError, TypeError, ValueError):
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                "the actor sent an unusable run",
                deployment=self.upstream.id,
            ) from None

    async def release(self, handle: Handle) -> None:
        await self.upstream.call_json("DELETE", f"{self.upstream.base_url}/runs/{handle.run_id}")

"""The sampling actor (seed 000): requests go to a per-run endpoint with the run's token.

A run is a remote resource handle with a lifetime the actor decides. The handle cache keeps
one per (credential, model) and renews its token ahead of expiry; exactly a
`sampling_run_inactive` 409 (or an expired run token, or a run the restarted actor no longer
knows) replaces the handle that failed and retries the call once. Any other answer is the
answer."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from ballast.config import Deployment
from ballast.providers.base import Adapter, AdapterContext, OutboundCall
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.resilience.handles import Handle, HandleCache, HandleUnavailable, Key
from ballast.upstream.client import Route, Upstream

log = logging.getLogger("ballast.providers.actor")

T = TypeVar("T")


class ActorAdapter(Adapter):
    name: ClassVar[str] = "actor"

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self.handles: HandleCache = HandleCache(
            self._create,
            self._release,
            context.clock,
            refresh_margin=context.handle_refresh_margin,
        )
        if context.shared_handles is not None:
            self.handles.shared = context.shared_handles

    async def close(self) -> None:
        await self.handles.close()

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """Not probed: its runs heal themselves, and a run is made per credential."""
        return None

    def routed(
        self, call: OutboundCall, model: str, send: Callable[[Route | None], Awaitable[T]]
    ) -> Awaitable[T]:
        return self._on_run(call, model, send)

    async def _on_run(
        self, call: OutboundCall, model: str, send: Callable[[Route | None], Awaitable[T]]
    ) -> T:
        key = (call.credential, model)
        try:
            handle = await self.handles.get(key)
            try:
                return await send(Route(handle.endpoint, handle.token))
            except Failure as failure:
                if not needs_new_handle(failure):
                    raise
                on_event = self.context.on_event
                if on_event is not None:
                    on_event("heal", {"deployment": self.upstream.id, "reason": failure.kind.label})
                log.info(
                    "deployment %s: run %s is gone, replacing it", self.upstream.id, handle.run_id
                )
                handle = await self.handles.replace(key, handle)
            return await send(Route(handle.endpoint, handle.token))
        except HandleUnavailable as exc:
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                str(exc),
                retry_after=exc.retry_after,
                deployment=self.upstream.id,
            ) from None

    async def _create(self, key: Key, session_id: str | None) -> Handle:
        """A new run on the service session of (credential, model), made once and reused."""
        upstream = self.upstream
        if session_id is None:
            sessions = self.context.sessions
            new_id = f"sess-{uuid.uuid4().hex}"
            session_id = (
                await sessions.get_or_create(key[0], key[1], lambda: new_id)
                if sessions is not None
                else new_id
            )
        url = upstream.base_url + "/runs"
        status, data = await upstream.call_json(
            "POST", url, {"model": key[1], "session_id": session_id}
        )
        if status not in (200, 201) or not isinstance(data, dict):
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                f"the actor refused a new run ({status})",
                status=status,
                deployment=upstream.id,
            )
        try:
            run_id = str(data["run_id"])
            return Handle(
                session_id=session_id,
                run_id=run_id,
                endpoint=f"{upstream.base_url}/runs/{run_id}/v1",
                token=str(data["token"]),
                expires_at=float(data["expires_at"]),
            )
        except (KeyError, TypeError, ValueError):
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                "the actor sent an unusable run",
                deployment=upstream.id,
            ) from None

    async def _release(self, handle: Handle) -> None:
        await self.upstream.call_json("DELETE", f"{self.upstream.base_url}/runs/{handle.run_id}")


def needs_new_handle(failure: Failure) -> bool:
    if failure.status == 409:
        return failures.error_code(failure.body) == "sampling_run_inactive"
    if failure.status == 401:
        return failures.error_code(failure.body) in ("token_expired", "invalid_token")
    if failure.status == 404:
        return failures.error_code(failure.body) == "run_not_found"  # the actor restarted
    return False

"""Gemini on Vertex AI: the same wire as AI Studio under a project's URL, with OAuth2 access
tokens from a service-account file or the application default credentials.

An access token is a remote resource handle with a lifetime, so it lives in the one
HandleCache the sampling actor's runs use: renewed ahead of expiry, made once for
concurrent requests, and on a 401 replaced and the call retried once. google-auth fetches
tokens with blocking I/O, so every fetch runs in a worker thread, never on the event loop;
it is imported only when a Vertex deployment starts."""

from __future__ import annotations

import asyncio
import calendar
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

from ballast.config import Deployment, GoogleSettings
from ballast.providers.base import AdapterContext, OutboundCall
from ballast.providers.gemini import GeminiAdapter
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.resilience.handles import Handle, HandleCache, HandleUnavailable, Key
from ballast.upstream.client import Route, Upstream
from ballast.upstream.provider_wire import Wire

log = logging.getLogger("ballast.providers.vertex")

T = TypeVar("T")
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class VertexAdapter(GeminiAdapter):
    name: ClassVar[str] = "vertex"

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self._auth = b""  # the token comes with each call's route
        google = deployment.google or GoogleSettings()
        self._settings = google
        self._prefix = f"/v1/projects/{google.project}/locations/{google.location}"
        self._credentials: Any = None
        self._issued = itertools.count(1)
        self._key: Key = ("", deployment.id)  # one token serves every model of the deployment
        self.handles: HandleCache = HandleCache(
            self._create, clock=context.clock, refresh_margin=context.handle_refresh_margin
        )

    async def close(self) -> None:
        await self.handles.close()

    def model_path(self, model: str) -> str:
        name = quote(self.upstream_model(model), safe="")
        return f"{self._prefix}/publishers/google/models/{name}"

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """Probed with the token in use, once there is one (a probe fetches none)."""
        if self.handles.peek(self._key) is None:
            return None
        return super().probe_request()

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire:
        handle = self.handles.peek(self._key)
        token = handle.token if handle is not None else ""
        return Wire("", f"authorization: Bearer {token}\r\n".encode("latin-1"))

    def routed(
        self, call: OutboundCall, model: str, send: Callable[[Route | None], Awaitable[T]]
    ) -> Awaitable[T]:
        return self._with_token(send)

    async def _with_token(self, send: Callable[[Route | None], Awaitable[T]]) -> T:
        key = self._key
        try:
            handle = await self.handles.get(key)
            try:
                return await send(Route(self.upstream.base_url, handle.token))
            except Failure as failure:
                if failure.status != 401:
                    raise
                log.info("deployment %s: access token refused, renewing it", self.upstream.id)
                handle = await self.handles.replace(key, handle)
            return await send(Route(self.upstream.base_url, handle.token))
        except HandleUnavailable as exc:
            raise Failure(
                failures.UPSTREAM_AUTH,
                "no Google access token could be had",
                retry_after=exc.retry_after,
                deployment=self.upstream.id,
            ) from None

    async def _create(self, key: Key, session_id: str | None) -> Handle:
        token, expires_at = await asyncio.to_thread(self._fetch_token)
        return Handle("", f"token-{next(self._issued)}", self.upstream.base_url, token, expires_at)

    def _fetch_token(self) -> tuple[str, float]:
        """A fresh access token and its expiry (wall-clock seconds); runs in a thread."""
        import google.auth
        import google.auth.transport.requests
        from google.oauth2 import service_account

        if self._credentials is None:
            path = self._settings.credentials_file
            if path is not None:
                make = service_account.Credentials.from_service_account_file
                self._credentials = make(path, scopes=[SCOPE])  # type: ignore[no-untyped-call]
            else:
                self._credentials, _ = google.auth.default(scopes=[SCOPE])
        credentials = self._credentials
        credentials.refresh(google.auth.transport.requests.Request())
        expiry = credentials.expiry  # naive UTC, as google-auth keeps it
        if expiry is None:
            return str(credentials.token), self.context.clock.time() + 3600.0
        return str(credentials.token), float(calendar.timegm(expiry.timetuple()))

"""The one small interface every job backend speaks, and the HTTP plumbing they share.

A backend call ends in exactly one of: a `Remote` answer (the job's state as the remote
sees it), `RateLimited` (the remote answered but asks us to wait), `NotFound`, `Rejected`
(a definite refusal), or `Unreachable` (no answer at all: network error, timeout, 5xx).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from ballast.config import JobBackendSettings

if TYPE_CHECKING:
    import aiohttp

# `alive` is an answer the protocol does not know: a heartbeat, never a verdict.
RemoteState = Literal["queued", "running", "succeeded", "failed", "cancelled", "alive"]


@dataclass(frozen=True, slots=True)
class Remote:
    state: RemoteState
    raw: str  # the remote's own status word
    remote_id: str | None = None
    output: Any = None
    error: str | None = None
    progress: float | None = None  # 0..1 when the backend reports one


def remote_of(
    data: dict[str, Any],
    state: RemoteState,
    raw: str,
    error: str | None,
    progress: float | None,
) -> Remote:
    """What every backend's answer ends as: its id, and its output once it succeeded."""
    remote_id = data.get("id")
    return Remote(
        state,
        raw,
        str(remote_id) if remote_id is not None else None,
        data.get("output") if state == "succeeded" else None,
        error,
        progress,
    )


class BackendError(Exception):
    pass


class Unreachable(BackendError):
    """No answer: contact is lost for as long as this keeps happening. `maybe_sent` is
    True when the request may have reached the remote (a timeout after sending)."""

    def __init__(self, message: str, maybe_sent: bool = False) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent


class RateLimited(BackendError):
    def __init__(self, retry_after: float | None) -> None:
        super().__init__(f"rate limited (retry after {retry_after})")
        self.retry_after = retry_after


class NotFound(BackendError):
    pass


class Rejected(BackendError):
    """A definite refusal (4xx other than 404/429): retrying the same call will not help."""


class JobBackend(Protocol):
    name: str
    settings: JobBackendSettings

    async def submit(self, job_id: str, payload: Any) -> Remote: ...

    async def status(self, remote_id: str) -> Remote: ...

    async def cancel(self, remote_id: str) -> Remote | None: ...

    async def close(self) -> None: ...


def retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def fraction(value: Any) -> float | None:
    """A progress figure as 0..1: accepts 0..1 fractions and 0..100 percentages."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if number > 1.0:
        number /= 100.0
    return min(1.0, max(0.0, number))


class HttpBackend:
    """JSON over HTTP with one pooled session; subclasses say where to go and how to read."""

    def __init__(self, name: str, settings: JobBackendSettings, instance: str = "") -> None:
        self.name = name
        self.settings = settings
        self.instance = instance
        self._session: aiohttp.ClientSession | None = None

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.settings.api_key is not None:
            headers["authorization"] = "Bearer " + self.settings.api_key.get_secret_value()
        if self.instance:
            headers["x-ballast-instance"] = self.instance
        return headers

    def session(self) -> aiohttp.ClientSession:
        # Imported here, not with the module: aiohttp is about 8 MB of a worker's memory,
        # and only a gateway that runs jobs on such a backend needs it.
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        extra_headers: dict[str, str] | None = None,
    ) -> Any:
        import aiohttp  # see `session`

        headers = self.headers()
        if extra_headers:
            headers.update(extra_headers)
        data = orjson.dumps(body) if body is not None else None
        try:
            async with self.session().request(
                method, self.settings.url + path, data=data, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
                if status == 429:
                    raise RateLimited(retry_after(response.headers))
                if status == 404:
                    raise NotFound(f"{path}: not found")
                if status >= 500 or status in (408, 502, 503, 504):
                    raise Unreachable(f"{path}: HTTP {status}")
                if status >= 400:
                    raise Rejected(f"HTTP {status}: {raw[:300].decode('utf-8', 'replace')}")
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            raise Unreachable(f"{path}: {type(exc).__name__}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{path}: {type(exc).__name__}", maybe_sent=True) from None
        except asyncio.CancelledError:
            raise
        try:
            return orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            raise Unreachable(f"{path}: answer is not JSON", maybe_sent=True) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

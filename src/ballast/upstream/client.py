"""Pooled HTTP to one deployment. Each deployment has its own bounded connection pool (a
bulkhead: a slow upstream exhausts only its own connections), opened at start-up and reused."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, NamedTuple

import aiohttp
import orjson
from multidict import CIMultiDict

from ballast import __version__
from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.routing import classify
from ballast.routing.classify import Failure

log = logging.getLogger("ballast.upstream")

USER_AGENT = f"ballast/{__version__}"

# Response headers that describe one hop, or that no longer hold once aiohttp decoded the body.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "date",
        "server",
        "set-cookie",
    }
)


# Raw upstream header name -> the lower-cased name a client may see, or None to drop it.
# Upstreams send the same few names over and over: each is judged once.
_RELAYED: dict[bytes, bytes | None] = {}


def _relayed_name(name: bytes) -> bytes | None:
    lowered = name.lower()
    keep = None if lowered.decode("latin-1") in _HOP_BY_HOP else lowered
    if len(_RELAYED) < 1024:
        _RELAYED[name] = keep
    return keep


def relay_headers(response: aiohttp.ClientResponse) -> tuple[tuple[bytes, bytes], ...]:
    """Upstream headers a client may see."""
    out = []
    cache = _RELAYED
    for name, value in response.raw_headers:
        keep = cache[name] if name in cache else _relayed_name(name)
        if keep is not None:
            out.append((keep, value))
    return tuple(out)


class Route(NamedTuple):
    """Where one request goes when the deployment hands out per-run endpoints and tokens."""

    base_url: str
    token: str


class Upstream:
    """One deployment's pooled session and the fixed parts of every request to it."""

    def __init__(
        self, deployment: Deployment, timeouts: Timeouts, settings: UpstreamSettings
    ) -> None:
        self.deployment = deployment
        self.id = deployment.id
        self.timeouts = timeouts
        self.base_url = deployment.url
        self._settings = settings
        # A user-agent of our own also keeps aiohttp off its slow path for skipped headers.
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "user-agent": USER_AGENT,
        }
        if deployment.api_key is not None:
            headers["authorization"] = f"Bearer {deployment.api_key.get_secret_value()}"
        headers.update(deployment.headers)
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeouts.pool + timeouts.connect, sock_connect=timeouts.connect
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.deployment.pool_size or self._settings.pool_size,
            limit_per_host=0,
            keepalive_timeout=self._settings.keepalive_timeout,
            ttl_dns_cache=300,
            family=socket.AF_UNSPEC,
        )
        # The fixed headers are the session's defaults, so a request adds only its own.
        fixed: CIMultiDict[str] = CIMultiDict()
        for name, value in self._headers.items():
            fixed[name] = value  # a later spelling of a name replaces an earlier one
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=fixed,
            timeout=self._timeout,
            auto_decompress=True,
        )

    async def warm(self, count: int) -> None:
        """Open `count` keep-alive connections now so the first requests skip the handshake."""
        if self._session is None or count <= 0:
            return

        async def one() -> None:
            assert self._session is not None
            try:
                async with asyncio.timeout(self.timeouts.connect):
                    async with self._session.get(self.base_url + "/models") as response:
                        await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError):
                log.info("could not warm a connection to deployment %s", self.id)

        await asyncio.gather(*(one() for _ in range(count)))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, path: str, body: bytes, request_id: str | None = None, route: Route | None = None
    ) -> aiohttp.ClientResponse:
        """Send a request and return once the response headers arrived. Errors before that are
        translated into the taxonomy here, at the adapter's edge. A `route` (a remote resource
        handle) replaces the base URL and the bearer token."""
        session = self._session
        if session is None:
            raise Failure(classify.CONNECT, "deployment is not started", deployment=self.id)
        headers: dict[str, str] | None = None
        base = self.base_url
        if route is not None:
            base = route.base_url
            headers = {"authorization": f"Bearer {route.token}"}
        if request_id is not None:
            if headers is None:
                headers = {"x-request-id": request_id}
            else:
                headers["x-request-id"] = request_id
        try:
            return await session.post(base + path, data=body, headers=headers)
        except aiohttp.ConnectionTimeoutError:
            raise Failure(classify.CONNECT, "connect timeout", deployment=self.id) from None
        except aiohttp.ClientConnectorError:
            raise Failure(classify.CONNECT, "connection refused", deployment=self.id) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError):
            raise Failure(classify.RESET, "connection reset", deployment=self.id) from None
        except aiohttp.ClientResponseError:
            raise Failure(classify.BAD_RESPONSE, "malformed response", deployment=self.id) from None
        except aiohttp.ClientError:
            raise Failure(classify.RESET, "connection failed", deployment=self.id) from None

    async def call_json(self, method: str, url: str, payload: Any | None = None) -> tuple[int, Any]:
        """A small control-plane call (create or release a remote resource) on the same pool."""
        if self._session is None:
            raise Failure(classify.CONNECT, "deployment is not started", deployment=self.id)
        budget = self.timeouts.first_token
        try:
            async with asyncio.timeout(budget):
                async with self._session.request(method, url, json=payload) as response:
                    raw = await response.read()
        except TimeoutError:
            raise Failure(
                classify.REQUEST_TIMEOUT, "control call timed out", deployment=self.id
            ) from None
        except aiohttp.ClientError:
            raise Failure(classify.CONNECT, "control call failed", deployment=self.id) from None
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        return response.status, data

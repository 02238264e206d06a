"""Pooled HTTP to one deployment. Each deployment has its own bounded connection pool (a
bulkhead: a slow upstream exhausts only its own connections), opened at start-up and reused."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
from typing import Any, NamedTuple

import orjson

from ballast import __version__
from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.resilience import failures
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline
from ballast.resilience.failures import Failure
from ballast.upstream import http1, proxy, tls
from ballast.upstream.http1 import (
    Pool,
    Response,
    default_tls_context,
    header_line,
    header_lines,
    split_url,
)
from ballast.upstream.provider_wire import Wire

log = logging.getLogger("ballast.upstream")

USER_AGENT = f"ballast/{__version__}"

# Response headers that describe one hop, or that no longer hold once the body is decoded.
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


def relay_headers(response: Response) -> tuple[tuple[bytes, bytes], ...]:
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


@dataclasses.dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """One attempt's request, as dispatch builds it once from the deployment's adapter:
    the client's `path`, the `body` the deployment is sent, the provider's `wire` (None:
    OpenAI's, untouched), the request id passed on, the `route` of a per-run endpoint, and
    `until` (monotonic), the attempt's deadline; `headers`, more header lines (the trace
    context, when tracing is on)."""

    path: str
    body: bytes
    wire: Wire | None = None
    request_id: str | None = None
    route: Route | None = None
    until: float = math.inf
    headers: bytes = b""

    def routed(self, route: Route | None) -> UpstreamRequest:
        """The same request sent along `route`."""
        return self if route is None else dataclasses.replace(self, route=route)


class Upstream:
    """One deployment's connection pool and the fixed parts of every request to it."""

    def __init__(
        self,
        deployment: Deployment,
        timeouts: Timeouts,
        settings: UpstreamSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.deployment = deployment
        self.clock = clock  # the pool's timers and the control calls' deadlines run on it
        self.id = deployment.id
        self.timeouts = timeouts
        self.base_url = deployment.url
        self._settings = settings
        # The most a whole answer may take, decoded (an embeddings answer is larger), and
        # one event of a stream: past them the answer is a BAD_RESPONSE naming the limit.
        self.max_response_bytes = deployment.max_response_bytes or settings.max_response_bytes
        self._max_embeddings = deployment.max_response_bytes or (
            settings.max_embeddings_response_bytes
        )
        self.max_event_bytes = settings.max_event_bytes
        self.max_kept_chars = settings.max_kept_chars  # a stream's text kept to continue it
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "accept-encoding": "identity",
            "user-agent": USER_AGENT,
        }
        auth: dict[str, str] = {}
        if deployment.api_key is not None:
            auth["authorization"] = f"Bearer {deployment.api_key.get_secret_value()}"
        # A configured header replaces ours of the same name, whatever its spelling.
        configured = {name.lower(): value for name, value in deployment.headers.items()}
        if "authorization" in configured:
            auth = {"authorization": configured.pop("authorization")}
        headers.update(configured)
        # Every request's fixed header lines, written once: with the deployment's credential,
        # and without it for a route that brings its own.
        self._fixed_lines = header_lines(headers)
        self._auth_lines = header_lines(auth)
        self._pool: Pool | None = None
        self._proxies: proxy.ProxyPolicy | None = None

    def answer_limit(self, path: str) -> int:
        """The most a whole answer to `path` may take."""
        return self._max_embeddings if path.endswith("/embeddings") else self.max_response_bytes

    async def start(self) -> None:
        """Make the pool, with the deployment's own TLS context when it has one and its
        proxies (its `proxy` setting, else the environment's). ConfigError for TLS files
        or a proxy URL that cannot be used."""
        context = tls.context_for(self.id, self.deployment.tls)
        self._proxies = proxy.policy_for(self.id, self.deployment.proxy, os.environ)
        self._pool = Pool(
            limit=self.deployment.pool_size or self._settings.pool_size,
            keepalive=self._settings.keepalive_timeout,
            connect_timeout=self.timeouts.connect,
            pool_timeout=self.timeouts.pool,
            ssl_context=context,
            proxies=self._proxies,
            clock=self.clock,
        )
        if context is None and self.base_url.startswith("https:"):
            default_tls_context()  # load the trust store now, not on a request

    async def warm(self, count: int) -> None:
        """Open `count` keep-alive connections now so the first requests skip the handshake."""
        if self._pool is None or count <= 0:
            return

        async def one() -> None:
            try:
                with Deadline(self.clock, self.clock.monotonic() + self.timeouts.connect):
                    response = await self._send("GET", self.base_url + "/models", None, None)
                    try:
                        await response.read()
                    finally:
                        response.release()
            except (Failure, TimeoutError):
                log.info("could not warm a connection to deployment %s", self.id)

        await asyncio.gather(*(one() for _ in range(count)))

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def post(self, request: UpstreamRequest) -> Response:
        """Send a request and return once the response headers arrived. Errors before that are
        translated into the taxonomy here, at the adapter's edge. A `route` (a remote resource
        handle) replaces the base URL and the bearer token; a `wire` (a provider's own format)
        replaces the method and path and brings its own header lines."""
        extra = b""
        base = self.base_url
        own_auth = False
        route = request.route
        if route is not None:
            base = route.base_url
            extra = _bearer_line(route.token)
            own_auth = True
        if request.request_id is not None:
            extra += _request_id_line(request.request_id)
        if request.headers:
            extra += request.headers
        wire = request.wire
        if wire is None:
            return await self._send("POST", base + request.path, request.body, extra, own_auth)
        extra += wire.headers
        own_auth = own_auth or wire.own_auth
        return await self._send(wire.method, base + wire.target, request.body, extra, own_auth)

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        extra: bytes | None,
        own_auth: bool = False,
    ) -> Response:
        pool = self._pool
        if pool is None:
            raise Failure(failures.CONNECT, "deployment is not started", deployment=self.id)
        try:
            origin, target = split_url(url)
        except ValueError:
            raise Failure(failures.CONNECT, "not a usable URL", deployment=self.id) from None
        forward = self._proxies.forward(origin) if self._proxies is not None else None
        if forward is None:
            parts = [method.encode(), b" ", target, b" HTTP/1.1\r\n", origin.host_header]
        else:  # plain http through a proxy: the absolute URL, and the proxy's credentials
            parts = [method.encode(), b" ", forward.prefix, target, b" HTTP/1.1\r\n"]
            parts += (origin.host_header, forward.authorization)
        parts.append(self._fixed_lines)
        if not own_auth:
            parts.append(self._auth_lines)
        if extra:
            parts.append(extra)
        if body is not None:
            parts.append(b"content-length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        try:
            return await pool.request(origin, b"".join(parts), body or b"")
        except http1.ConnectTimeout as exc:
            raise Failure(failures.CONNECT, str(exc), deployment=self.id) from None
        except http1.PoolTimeout:
            # Our bulkhead is full: the deployment is busy, not failing.
            raise Failure(
                failures.POOL_TIMEOUT, "no free pooled connection", deployment=self.id
            ) from None
        except http1.ConnectFailed as exc:
            # What the connect met (refused, no route, a TLS or proxy refusal): the operator's
            # first question, so the failure says it.
            raise Failure(failures.CONNECT, str(exc), deployment=self.id) from None
        except http1.BadResponse:
            raise Failure(failures.BAD_RESPONSE, "malformed response", deployment=self.id) from None
        except http1.HttpError:
            raise Failure(failures.RESET, "connection reset", deployment=self.id) from None

    async def call_json(
        self, method: str, url: str, payload: Any | None = None, wire: Wire | None = None
    ) -> tuple[int, Any]:
        """A small control-plane call (create or release a remote resource, a probe) on the
        same pool; `payload` as JSON, or bytes sent as they are; a `wire` brings the
        provider's own header lines instead of the bearer."""
        budget = self.timeouts.first_token
        if isinstance(payload, bytes):
            body: bytes | None = payload
        else:
            body = orjson.dumps(payload) if payload is not None else None
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = b""
        extra = None if wire is None else wire.headers
        own_auth = wire is not None and wire.own_auth
        try:
            with Deadline(self.clock, self.clock.monotonic() + budget):
                response = await self._send(method, url, body, extra, own_auth)
                try:
                    raw = await response.read()
                finally:
                    response.release()
        except TimeoutError:
            raise Failure(
                failures.REQUEST_TIMEOUT, "control call timed out", deployment=self.id
            ) from None
        except http1.HttpError:
            raise Failure(failures.CONNECT, "control call failed", deployment=self.id) from None
        except Failure as failure:
            raise Failure(
                failures.CONNECT, f"control call failed: {failure.message}", deployment=self.id
            ) from None
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        return response.status, data


def _bearer_line(token: str) -> bytes:
    try:
        return header_line("authorization", f"Bearer {token}")
    except ValueError:
        raise Failure(failures.CONNECT, "a run's token is not a valid header value") from None


def _request_id_line(request_id: str) -> bytes:
    """The client's request id, passed on; one that could break the framing is dropped."""
    try:
        return header_line("x-request-id", request_id)
    except ValueError:
        return b""

"""The actor's HTTP surface (aiohttp.web).

Control plane (``Authorization: Bearer <control secret>``):
``POST /runs {model, session_id}`` -> 201 ``{run_id, token, expires_at}``;
``POST /runs/{run_id}/token`` -> 200 a fresh token for an active run;
``DELETE /runs/{run_id}`` -> 200 ``{run_id, deleted: true}``.

Data plane (``Authorization: Bearer <run token>``):
``POST /runs/{run_id}/v1/chat/completions`` and ``.../v1/completions`` are proxied to the
backend byte for byte, streams relayed chunk by chunk. A run that is no longer active
(reclaimed after idling, or deleted) answers ``409 sampling_run_inactive``; a run the
actor never had answers ``404 run_not_found``.

Open: ``GET /metrics/runs`` (also ``/stats``) and ``GET /health``.
Every error has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ballast.actor.runs import Ended, Run, RunRegistry
from ballast.actor.tokens import INVALID_TOKEN, TokenError, TokenIssuer
from ballast.resilience.clock import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_FIELD_CHARS = 512
SWEEP_CAP_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
POOL_LIMIT = 512

INACTIVE_CODE = "sampling_run_inactive"
INACTIVE_MESSAGE = "sampling run is not active"

# Headers that belong to one connection, or that the actor sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "cookie", "expect"}
_NOT_RETURNED = _HOP_BY_HOP | {"server", "date", "set-cookie"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ActorState:
    """Everything the handlers share. ``session`` exists between start-up and clean-up."""

    def __init__(
        self,
        *,
        backend_url: str,
        registry: RunRegistry,
        tokens: TokenIssuer,
        control_secret: str,
        sweep_interval: float,
        backend_api_key: str | None,
    ) -> None:
        self.backend_url = backend_url
        self.registry = registry
        self.tokens = tokens
        self._control_secret = control_secret.encode()
        self.sweep_interval = sweep_interval
        self._backend_api_key = backend_api_key
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never show the secrets
        return f"ActorState(backend_url={self.backend_url!r})"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the actor app has not been started")
        return self._session

    def control_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode(), self._control_secret
        )

    def backend_headers(self, incoming: CIMultiDictProxy[str]) -> CIMultiDict[str]:
        headers = CIMultiDict(
            (name, value) for name, value in incoming.items() if name.lower() not in _NOT_FORWARDED
        )
        headers.setdefault("Content-Type", "application/json")
        # Bytes are relayed as they are, so ask for nothing the client did not ask for.
        headers.setdefault("Accept-Encoding", "identity")
        if self._backend_api_key:
            headers["Authorization"] = f"Bearer {self._backend_api_key}"
        return headers


ACTOR: web.AppKey[ActorState] = web.AppKey("actor", ActorState)


def normalise_backend_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing ``/`` or ``/v1``."""
    parsed = URL(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"backend URL must be http(s)://host[:port], got {url!r}")
    base = str(parsed.with_query(None).with_fragment(None)).rstrip("/")
    return base.removesuffix("/v1")


# -- responses -------------------------------------------------------------------------


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(
    status: int,
    message: str,
    code: str | None,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return json_response(body, status, headers)


def inactive_response() -> web.Response:
    return error_response(409, INACTIVE_MESSAGE, INACTIVE_CODE)


def _unauthorised(message: str, code: str) -> web.Response:
    return error_response(401, message, code, headers={"WWW-Authenticate": "Bearer"})


def _bearer(request: web.Request) -> str | None:
    value = request.headers.get("Authorization", "")
    scheme, _, credential = value.partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential


def _control_denied(request: web.Request) -> web.Response | None:
    if request.app[ACTOR].control_ok(_bearer(request)):
        return None
    return _unauthorised("missing or invalid control secret", "invalid_api_key")


def _run_not_found(run_id: str) -> web.Response:
    return error_response(404, f"no sampling run {run_id!r}", "run_not_found")


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router and framework errors (404, 405, 413 ...) in OpenAI's shape too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error_response(exc.status, exc.reason, code.get(exc.status))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal error in the actor", None, error_type="api_error")


# -- control plane -----------------------------------------------------------------------


async def _create_run(request: web.Request) -> web.Response:
    denied = _control_denied(request)
    if denied is not None:
        return denied
    state = request.app[ACTOR]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return error_response(400, "the body must be JSON", "invalid_json")
    if not isinstance(body, dict):
        return error_response(400, "the body must be a JSON object", "invalid_body")
    fields: dict[str, str] = {}
    for name in ("model", "session_id"):
        value = body.get(name)
        if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS:
            message = f"'{name}' must be a non-empty string of at most {MAX_FIELD_CHARS} chars"
            return error_response(400, message, "invalid_value", param=name)
        fields[name] = value
    run = state.registry.create(fields["model"], fields["session_id"])
    issued = state.tokens.issue(run.run_id, run.session_id, run.model)
    return json_response(
        {"run_id": run.run_id, "token": issued.token, "expires_at": issued.expires_at}, 201
    )


async def _refresh_token(request: web.Request) -> web.Response:
    denied = _control_denied(request)
    if denied is not None:
        return denied
    state = request.app[ACTOR]
    run_id = request.match_info["run_id"]
    found = state.registry.get(run_id)
    if found is None:
        return _run_not_found(run_id)
    if isinstance(found, Ended):
        return inactive_response()
    issued = state.tokens.issue(found.run_id, found.session_id, found.model)
    return json_response(
        {"run_id": found.run_id, "token": issued.token, "expires_at": issued.expires_at}
    )


async def _delete_run(request: web.Request) -> web.Response:
    denied = _control_denied(request)
    if denied is not None:
        return denied
    run_id = request.match_info["run_id"]
    if not request.app[ACTOR].registry.delete(run_id):
        return _run_not_found(run_id)
    return json_response({"run_id": run_id, "deleted": True})


async def _stats(request: web.Request) -> web.Response:
    return json_response(request.app[ACTOR].registry.stats())


async def _health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


# -- data plane --------------------------------------------------------------------------


def _authorised_run(request: web.Request) -> Run | web.Response:
    state = request.app[ACTOR]
    run_id = request.match_info["run_id"]
    token = _bearer(request)
    if token is None:
        return _unauthorised("missing run token", INVALID_TOKEN)
    try:
        claims = state.tokens.verify(token)
    except TokenError as exc:
        return _unauthorised(exc.message, exc.code)
    if claims["sub"] != run_id:
        return _unauthorised("the token is not for this run", INVALID_TOKEN)
    found = state.registry.get(run_id)
    if found is None:
        return _run_not_found(run_id)
    if isinstance(found, Ended):
        return inactive_response()
    return found


def _backend_unavailable() -> web.Response:
    return error_response(
        502, "the inference backend is unavailable", "backend_unavailable", error_type="api_error"
    )


async def _relay(request: web.Request, state: ActorState, path: str) -> web.StreamResponse:
    body = await request.read()
    headers = state.backend_headers(request.headers)
    try:
        upstream = await state.session.post(state.backend_url + path, data=body, headers=headers)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        logger.warning("backend request failed: %s", type(exc).__name__)
        return _backend_unavailable()
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    try:
        for name, value in upstream.headers.items():
            if name.lower() not in _NOT_RETURNED:
                response.headers.add(name, value)
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        # The client went away (our write failed); drop the backend request with it.
        logger.info("client disconnected from run %s", request.match_info["run_id"])
    except (aiohttp.ClientError, TimeoutError) as exc:
        # The backend failed mid-answer. Headers may be out already: end the connection
        # without a clean end of body, so the client sees the answer is incomplete.
        logger.warning("backend answer broke off: %s", type(exc).__name__)
        if not response.prepared:
            return _backend_unavailable()
        if request.transport is not None:
            request.transport.close()
    finally:
        upstream.close()
    return response


def _proxy(path: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        found = _authorised_run(request)
        if not isinstance(found, Run):
            return found
        registry = request.app[ACTOR].registry
        registry.begin(found)
        try:
            return await _relay(request, request.app[ACTOR], path)
        finally:
            registry.finish(found)

    return handler


# -- lifecycle ---------------------------------------------------------------------------


async def _sweep_forever(state: ActorState) -> None:
    clock = state.registry.clock
    while True:
        await clock.sleep(state.sweep_interval)
        try:
            state.registry.sweep()
        except Exception:
            logger.exception("sweeping idle runs failed")


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[ACTOR]
    connector = aiohttp.TCPConnector(limit=POOL_LIMIT, keepalive_timeout=30)
    state._session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS),
    )
    sweeper = asyncio.create_task(_sweep_forever(state), name="actor-sweeper")
    try:
        yield
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await state._session.close()
        state._session = None


def default_sweep_interval(idle_timeout: float) -> float:
    return min(idle_timeout / 4.0, SWEEP_CAP_SECONDS)


def create_app(
    backend_url: str,
    *,
    control_secret: str,
    jwt_secret: str,
    idle_timeout: float = 900.0,
    jwt_ttl: float = 3600.0,
    clock: Clock = SYSTEM_CLOCK,
    sweep_interval: float | None = None,
    backend_api_key: str | None = None,
) -> web.Application:
    """The actor app; the pooled backend session and the sweeper live while it runs."""
    if not control_secret:
        raise ValueError("the control secret must not be empty")
    interval = default_sweep_interval(idle_timeout) if sweep_interval is None else sweep_interval
    if not interval > 0:
        raise ValueError("sweep_interval must be a positive number of seconds")
    state = ActorState(
        backend_url=normalise_backend_url(backend_url),
        registry=RunRegistry(idle_timeout, clock),
        tokens=TokenIssuer(jwt_secret, jwt_ttl, clock),
        control_secret=control_secret,
        sweep_interval=interval,
        backend_api_key=backend_api_key,
    )
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors_as_json])
    app[ACTOR] = state
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_post("/runs", _create_run)
    app.router.add_post("/runs/{run_id}/token", _refresh_token)
    app.router.add_delete("/runs/{run_id}", _delete_run)
    app.router.add_post("/runs/{run_id}/v1/chat/completions", _proxy("/v1/chat/completions"))
    app.router.add_post("/runs/{run_id}/v1/completions", _proxy("/v1/completions"))
    app.router.add_get("/metrics/runs", _stats)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", _health)
    return app

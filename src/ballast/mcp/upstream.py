"""One upstream MCP server: the revision it speaks (found out once and remembered), its
sessions, its breaker and its clocks, and the healing of a lost session.

An upstream session is a remote resource handle (resilience/handles.py, the one
implementation of healing): keyed by (holder, server), where the holder is a client session
or, for stateless clients, the gateway itself. A server that restarted or reclaimed a
session answers **404** to its id; exactly that, on a request that carried an id, drops the
handle, initializes a new session (one initialize for every request that met the same
404) and replays the request once. A second 404 is the caller's error; a 404 to a request
without a session id is not a session loss."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

from ballast import __version__
from ballast.config import McpServerSettings, breaker_config
from ballast.mcp import jsonrpc
from ballast.mcp.link import Link, Reply
from ballast.resilience import failures
from ballast.resilience.breaker import BreakerState, CircuitBreaker
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline
from ballast.resilience.failures import Failure
from ballast.resilience.handles import Handle, HandleCache, HandleUnavailable
from ballast.upstream.http1 import header_line, header_lines

log = logging.getLogger("ballast.mcp")

CLIENT_INFO = {"name": "ballast", "version": __version__}
GATEWAY = ""  # the holder of the session stateless clients share


class ServerDown(Exception):
    """The server gave no usable answer; `kind` says how (a low-cardinality label)."""

    def __init__(self, server: str, kind: str, message: str) -> None:
        super().__init__(message)
        self.server = server
        self.kind = kind
        self.message = message


class _SessionLost(Exception):
    """A replayed request met a 404 again."""


class McpUpstream:
    """One server behind `/mcp`."""

    def __init__(
        self,
        settings: McpServerSettings,
        link: Link,
        clock: Clock = SYSTEM_CLOCK,
        on_transition: Callable[[str, BreakerState, BreakerState], None] | None = None,
        on_heal: Callable[[str], None] | None = None,
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.link = link
        self.clock = clock
        self.breaker = CircuitBreaker(
            f"mcp:{self.name}", breaker_config(settings.breaker), clock, on_transition
        )
        self.handles = HandleCache(
            self._initialize,
            self._release,
            clock,
            failure_backoff=settings.heal_backoff,
            max_failure_backoff=settings.max_heal_backoff,
        )
        # None until found out: True for a server of the stateless revision.
        self.modern: bool | None = {"auto": None, jsonrpc.MODERN: True}.get(
            settings.revision, False
        )
        self.version = jsonrpc.LATEST_HANDSHAKE  # what the last initialize agreed on
        self.heals = 0
        self._on_heal = on_heal
        self._ids = itertools.count(1)
        self._discovery: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.link.start()

    async def close(self) -> None:
        await self.handles.close()
        await self.link.close()

    def forget(self, holder: str) -> None:
        """A client session ended: end its session on this server, in the background."""
        self.handles.forget((holder, self.name))

    async def request(
        self, holder: str, method: str, params: dict[str, Any], seconds: float, tries: int = 1
    ) -> dict[str, Any]:
        """The server's JSON-RPC answer (`result` or `error`) to one request, under the
        breaker and a deadline of `seconds` per try (a failure to connect or a broken answer
        is tried again, `tries` in all; a timeout is not); ServerDown when none came."""
        for _ in range(max(1, tries)):
            outcome = await self._try(holder, method, params, seconds)
            if isinstance(outcome, dict):
                return outcome
        # Raised here, never kept in a variable first: an error held by a frame its own
        # traceback holds is a reference cycle.
        raise ServerDown(self.name, *outcome)

    async def _try(
        self, holder: str, method: str, params: dict[str, Any], seconds: float
    ) -> dict[str, Any] | tuple[str, str]:
        """One try: the answer, or (kind, message) of a failure worth another try."""
        permit = self.breaker.acquire()
        if permit is None:
            wait = math.ceil(self.breaker.retry_after())
            message = f"MCP server {self.name} is failing; retry in {wait}s"
            raise ServerDown(self.name, "breaker_open", message)
        try:
            with Deadline(self.clock, self.clock.monotonic() + seconds):
                answer = await self._exchange(holder, method, params)
        except asyncio.CancelledError:
            self.breaker.release(permit)
            raise
        except _SessionLost:
            self.breaker.release(permit)
            message = f"MCP server {self.name} lost the session twice"
            raise ServerDown(self.name, "session_lost", message) from None
        except TimeoutError:
            self.breaker.record_failure(permit)
            message = f"MCP server {self.name} did not answer in {seconds:g}s"
            raise ServerDown(self.name, "timeout", message) from None  # no second wait
        except HandleUnavailable:
            self.breaker.record_failure(permit)
            return "unavailable", f"MCP server {self.name} cannot start a session"
        except Failure as failure:
            if failure.kind.health_failure:
                self.breaker.record_failure(permit)
            else:
                self.breaker.release(permit)
            return failure.kind.label, f"MCP server {self.name}: {failure.kind.label}"
        self.breaker.record_success(permit)
        return answer

    async def _exchange(self, holder: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.modern is None:
            await self._discover()
        if self.modern:
            return self._answer(await self._stateless(method, params))
        key = (holder, self.name)
        handle = await self.handles.get(key)
        reply = await self._post(method, params, handle)
        if reply.status == 404 and handle.run_id:
            self.heals += 1
            if self._on_heal is not None:
                self._on_heal(self.name)
            log.info("MCP server %s lost a session; initializing a new one", self.name)
            handle = await self.handles.replace(key, handle)
            reply = await self._post(method, params, handle)
            if reply.status == 404:
                raise _SessionLost
        return self._answer(reply)

    def _answer(self, reply: Reply) -> dict[str, Any]:
        if reply.status >= 500 or reply.status == 429:
            raise Failure(
                failures.SERVER_ERROR, f"HTTP {reply.status}", reply.status, deployment=self.name
            )
        if reply.message is not None:
            return reply.message
        return {
            "error": {
                "code": jsonrpc.INTERNAL_ERROR,
                "message": f"MCP server {self.name} answered HTTP {reply.status} without an answer",
            }
        }

    # -- the handshake revisions: sessions --------------------------------------------

    def _session_lines(self, session: str) -> bytes:
        lines = header_line("mcp-protocol-version", self.version)
        return lines + header_line("mcp-session-id", session) if session else lines

    async def _post(self, method: str, params: dict[str, Any], handle: Handle) -> Reply:
        id_ = next(self._ids)
        meta = params.get("_meta")
        if isinstance(meta, dict) and jsonrpc.META_VERSION in meta:
            # A stateless client's envelope means nothing inside a session: left out.
            kept = {k: v for k, v in meta.items() if k not in jsonrpc.ENVELOPE}
            params = {**params, "_meta": kept}
        body = jsonrpc.request(id_, method, params)
        return await self.link.post(body, self._session_lines(handle.run_id), id_)

    async def _initialize(self, key: tuple[str, str], _previous: str | None) -> Handle:
        """A new session for `key` (in the handle cache's own task, under its own clock)."""
        with Deadline(self.clock, self.clock.monotonic() + self.settings.list_timeout):
            id_ = next(self._ids)
            params = {
                "protocolVersion": jsonrpc.LATEST_HANDSHAKE,
                "capabilities": {},
                "clientInfo": CLIENT_INFO,
            }
            reply = await self.link.post(jsonrpc.request(id_, "initialize", params), b"", id_)
            result = reply.message.get("result") if reply.message is not None else None
            if reply.status != 200 or not isinstance(result, dict):
                raise Failure(
                    failures.BAD_RESPONSE,
                    f"initialize answered HTTP {reply.status}",
                    reply.status,
                    deployment=self.name,
                )
            version = result.get("protocolVersion")
            if version in jsonrpc.HANDSHAKE_VERSIONS:
                self.version = version
            session = reply.session or ""
            try:
                lines = self._session_lines(session)
            except ValueError:
                raise Failure(
                    failures.BAD_RESPONSE, "a session id that is no header", deployment=self.name
                ) from None
            initialized = jsonrpc.notification("notifications/initialized")
            await self.link.post(initialized, lines, None)
        return Handle(key[0], session, self.settings.url, "", math.inf)

    async def _release(self, handle: Handle) -> None:
        if handle.run_id:
            with Deadline(self.clock, self.clock.monotonic() + self.settings.list_timeout):
                await self.link.delete(self._session_lines(handle.run_id))

    # -- the stateless revision ------------------------------------------------------

    async def _discover(self) -> None:
        """Whether the server speaks the stateless revision: asked once (concurrent callers
        share the question), by trying it first; any answer but a discover result that
        names it means the handshake. A server that cannot be reached is asked again."""
        task = self._discovery
        if task is None:
            task = self._discovery = asyncio.ensure_future(self._ask())
            task.add_done_callback(self._asked)
        await asyncio.shield(task)

    def _asked(self, task: asyncio.Task[None]) -> None:
        self._discovery = None
        if not task.cancelled():
            task.exception()  # retrieved: the waiters got it

    async def _ask(self) -> None:
        with Deadline(self.clock, self.clock.monotonic() + self.settings.list_timeout):
            reply = await self._stateless("server/discover", {})
        if reply.status >= 500:
            raise Failure(failures.SERVER_ERROR, f"HTTP {reply.status}", deployment=self.name)
        result = reply.message.get("result") if reply.message is not None else None
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        self.modern = isinstance(versions, list) and jsonrpc.MODERN in versions
        log.info(
            "MCP server %s speaks %s",
            self.name,
            jsonrpc.MODERN if self.modern else "the handshake revisions",
        )

    async def _stateless(self, method: str, params: dict[str, Any]) -> Reply:
        id_ = next(self._ids)
        meta = dict(params.get("_meta") or {})
        meta[jsonrpc.META_VERSION] = jsonrpc.MODERN
        meta[jsonrpc.META_CAPABILITIES] = {}
        meta[jsonrpc.META_CLIENT] = CLIENT_INFO
        headers = {"mcp-protocol-version": jsonrpc.MODERN, "mcp-method": method}
        named = jsonrpc.NAMED.get(method)
        if named is not None and isinstance(params.get(named), str):
            headers["mcp-name"] = params[named]
        try:
            extra = header_lines(headers)
        except ValueError:
            raise Failure(
                failures.CLIENT_ERROR, "a name that is no header value", deployment=self.name
            ) from None
        body = jsonrpc.request(id_, method, {**params, "_meta": meta})
        return await self.link.post(body, extra, id_)

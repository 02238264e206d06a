"""`/mcp`: Streamable HTTP toward clients, in front of every configured MCP server.

Each client message is one POST: the key is checked first (a caller without a valid one
learns nothing), the body is read bounded and parsed once, a request is answered with one
JSON object (or one SSE event, for a client that takes only a stream), a notification with
202. Clients of the handshake revisions get a session id at `initialize`; clients of the
stateless revision (2026-07-28) send `Mcp-Method` and `Mcp-Name`, which must agree with the
body. The servers' credentials are Ballast's own: a client's token never goes upstream."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from ballast.config import McpServerSettings, Settings
from ballast.mcp import jsonrpc
from ballast.mcp.catalog import Catalog
from ballast.mcp.jsonrpc import Message, RpcError
from ballast.mcp.link import Link
from ballast.mcp.methods import Call, Methods
from ballast.mcp.sessions import ClientSessions
from ballast.mcp.upstream import GATEWAY, McpUpstream
from ballast.observe.hub import Observer
from ballast.observe.tracing import Tracer
from ballast.pipeline.access import Access
from ballast.pipeline.asgi import EVENT_STREAM, JSON, NO_CACHE, header, read_body, send_bytes
from ballast.pipeline.errors import ApiError
from ballast.resilience.breaker import BreakerState
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.keys import KeyRecord
from ballast.types import Receive, Scope, Send

log = logging.getLogger("ballast.mcp")

MCP_PATH = "/mcp"
_KNOWN_VERSIONS = frozenset((*jsonrpc.HANDSHAKE_VERSIONS, *jsonrpc.MODERN_VERSIONS))


class McpGateway:
    """`/mcp` and what it holds: the servers, their catalog, the client sessions."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
        observer: Observer | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        mcp = settings.mcp
        self.settings = mcp
        self.clock = clock
        self.body_timeout = settings.server.body_timeout
        self.access: Access | None = None  # set at start-up, as the pipeline's
        self._observe = settings.observe
        self._observer = observer
        self.upstreams = {server.name: self._upstream(server, settings) for server in mcp.servers}
        self.catalog = Catalog(mcp, self.upstreams)
        self.sessions = ClientSessions(mcp.session_idle, mcp.max_sessions, self._ended, clock)
        self.methods = Methods(
            self.catalog,
            lambda: self.access,
            observer.metrics if observer is not None else None,
            clock,
            tracer,
            self._key_series if observer is not None else None,
        )

    def _upstream(self, server: McpServerSettings, settings: Settings) -> McpUpstream:
        link = Link(
            server, settings.upstream.keepalive_timeout, settings.mcp.max_answer_bytes, self.clock
        )
        return McpUpstream(server, link, self.clock, self._breaker_moved, self._healed)

    async def reconfigure(self, settings: Settings) -> list[McpUpstream]:
        """A config reload: a server whose settings did not change keeps its state (its
        sessions, breaker, the revision it speaks); a new or changed one starts afresh.
        Returns the servers left out, for the caller to `retire` once their calls ended."""
        mcp = settings.mcp
        upstreams: dict[str, McpUpstream] = {}
        alike = mcp.max_answer_bytes == self.settings.max_answer_bytes  # every server's wire
        for server in mcp.servers:
            old = self.upstreams.get(server.name)
            if old is not None and old.settings == server and alike:
                upstreams[server.name] = old
                continue
            upstream = self._upstream(server, settings)
            await upstream.start()
            upstreams[server.name] = upstream
        gone = [u for name, u in self.upstreams.items() if upstreams.get(name) is not u]
        # The swap: no await from here on, so no request sees half of it.
        self.settings = mcp
        self.upstreams = upstreams
        self.catalog = self.methods.catalog = Catalog(mcp, upstreams)
        self.sessions.idle, self.sessions.limit = mcp.session_idle, mcp.max_sessions
        self.body_timeout = settings.server.body_timeout
        self._observe = settings.observe
        return gone

    async def retire(self, upstreams: list[McpUpstream], grace: float) -> None:
        """Close servers a reload left out, after `grace` seconds for the calls under way."""
        if upstreams:
            await self.clock.sleep(grace)
            for upstream in upstreams:
                await upstream.close()

    async def start(self) -> None:
        for upstream in self.upstreams.values():
            await upstream.start()

    async def close(self) -> None:
        self.sessions.close()
        for upstream in self.upstreams.values():
            await upstream.close()

    def snapshot(self) -> dict[str, Any]:
        """Each server's breaker, revision, heals and sessions (the admin state, the
        dashboard)."""
        servers = [
            {
                "name": upstream.name,
                "revision": {None: "unknown", True: jsonrpc.MODERN}.get(
                    upstream.modern, upstream.version
                ),
                "breaker": upstream.breaker.snapshot(),
                "heals": upstream.heals,
                "sessions": len(upstream.handles),
            }
            for upstream in self.upstreams.values()
        ]
        return {"servers": servers, "client_sessions": len(self.sessions)}

    def _ended(self, session_id: str) -> None:
        for upstream in self.upstreams.values():
            upstream.forget(session_id)

    def _key_series(self, key_id: str) -> str:
        assert self._observer is not None
        return self._observer.key_label(key_id, self._observe)

    def _breaker_moved(self, name: str, old: BreakerState, new: BreakerState) -> None:
        if self._observer is not None:
            fields = {"deployment": name, "from": old.value, "to": new.value}
            self._observer.on_event("breaker", fields)

    def _healed(self, server: str) -> None:
        if self._observer is not None:
            fields = {"deployment": f"mcp:{server}", "reason": "mcp_session_lost"}
            self._observer.on_event("heal", fields)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method == "POST":
            await self._post(scope, receive, send)
        elif method == "DELETE":
            await self._delete(scope, send)
        else:
            refusal = RpcError(jsonrpc.INVALID_REQUEST, "POST messages to /mcp.", 405)
            body = orjson.dumps(refusal.body(None))
            await _send(send, 405, body, [(b"allow", b"POST, DELETE")])

    async def overloaded(self, send: Send) -> None:
        """Ballast is at its bound of requests at once: come back shortly."""
        busy = RpcError(jsonrpc.SERVER_BUSY, "Ballast is at capacity right now; retry shortly.")
        await _send(send, 503, orjson.dumps(busy.body(None)), [(b"retry-after", b"1")])

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        id_: jsonrpc.Id = None
        extra: list[tuple[bytes, bytes]] = []
        try:
            key = await self._identify(scope)
            message = await self._read(scope, receive)
            id_ = message.id
            modern = _modern(scope, message)
            if not message.is_request:
                await send_bytes(send, 202, [], b"")
                return
            if message.method == "initialize" and not modern:
                version, result = self.methods.initialize(message.params)
                session = self.sessions.open(key.id if key is not None else None, version)
                extra.append((b"mcp-session-id", session.id.encode()))
            else:
                holder = self._holder(scope, key, modern)
                result = await self.methods.answer(Call(message, key, holder, modern))
                if modern:  # the stateless revision's results say whether they are whole
                    result.setdefault("resultType", "complete")
            body = orjson.dumps(jsonrpc.result(id_, result))
            await self._answer(scope, send, 200, body, extra)
        except RpcError as error:
            await self._answer(scope, send, error.status, orjson.dumps(error.body(id_)), extra)

    async def _identify(self, scope: Scope) -> KeyRecord | None:
        access = self.access
        if access is None:
            return None
        try:
            return await access.identify(scope, header(scope, b"authorization"))
        except ApiError as refused:
            raise RpcError(jsonrpc.UNAUTHORIZED, refused.message, refused.status) from None

    async def _read(self, scope: Scope, receive: Receive) -> Message:
        limit = self.settings.max_message_bytes
        try:
            body = await read_body(scope, receive, limit, self.body_timeout, self.clock)
        except ApiError as refused:
            raise RpcError(jsonrpc.INVALID_REQUEST, refused.message, refused.status) from None
        return jsonrpc.parse(body)

    def _holder(self, scope: Scope, key: KeyRecord | None, modern: bool) -> str:
        """Whose upstream sessions serve the request: the client session it names (404 when
        there is no such live session of this key), else the gateway's shared ones."""
        if modern:
            return GATEWAY
        given = header(scope, b"mcp-session-id")
        if given is None:
            return GATEWAY
        session = self.sessions.use(given.decode("latin-1"), key.id if key is not None else None)
        if session is None:
            raise RpcError(jsonrpc.INVALID_REQUEST, "Session not found.", 404)
        return session.id

    async def _delete(self, scope: Scope, send: Send) -> None:
        try:
            key = await self._identify(scope)
        except RpcError as error:
            await _send(send, error.status, orjson.dumps(error.body(None)))
            return
        given = header(scope, b"mcp-session-id")
        found = given is not None and self.sessions.use(
            given.decode("latin-1"), key.id if key is not None else None
        )
        if not found or given is None:
            missing = RpcError(jsonrpc.INVALID_REQUEST, "Session not found.", 404)
            await _send(send, 404, orjson.dumps(missing.body(None)))
            return
        self.sessions.end(given.decode("latin-1"))
        await send_bytes(send, 204, [], b"")

    async def _answer(
        self, scope: Scope, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]
    ) -> None:
        """One JSON object, or one SSE event for a client that accepts only a stream."""
        accept = header(scope, b"accept") or b""
        if b"text/event-stream" in accept and b"application/json" not in accept and status == 200:
            event = b"event: message\ndata: " + body + b"\n\n"
            await send_bytes(send, 200, [EVENT_STREAM, NO_CACHE, *extra], event)
            return
        await _send(send, status, body, extra)


async def _send(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_bytes(send, status, [JSON, *(extra or ())], body)


def _modern(scope: Scope, message: Message) -> bool:
    """Whether the client speaks the stateless revision; 400 when its headers disagree with
    its body, or name a revision Ballast does not know."""
    given = header(scope, b"mcp-protocol-version")
    version = given.decode("latin-1") if given is not None else None
    if version is not None and version not in _KNOWN_VERSIONS:
        raise RpcError(
            jsonrpc.UNSUPPORTED_VERSION,
            f"Unsupported MCP protocol version '{version[:40]}'.",
            400,
            {"supported": sorted(_KNOWN_VERSIONS), "requested": version[:40]},
        )
    meta_version = message.meta.get(jsonrpc.META_VERSION)
    if version != jsonrpc.MODERN and meta_version != jsonrpc.MODERN:
        return False
    if message.is_request and (version != meta_version or _mismatch(scope, message)):
        raise RpcError(
            jsonrpc.HEADER_MISMATCH, "The Mcp-* headers do not agree with the body.", 400
        )
    return True


def _mismatch(scope: Scope, message: Message) -> bool:
    method = header(scope, b"mcp-method")
    if method is None or method.decode("latin-1") != message.method:
        return True
    named = jsonrpc.NAMED.get(message.method or "")
    if named is None:
        return False
    value: Any = message.params.get(named)
    given = header(scope, b"mcp-name")
    return value is not None and (given is None or given.decode("latin-1") != value)

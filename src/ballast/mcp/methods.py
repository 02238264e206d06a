"""What Ballast answers to each MCP method: its own handshake and discovery, lists merged
from every server, and calls routed to one (tools/call, prompts/get, resources/read)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ballast import __version__
from ballast.mcp import jsonrpc
from ballast.mcp.catalog import LISTS, Catalog
from ballast.mcp.jsonrpc import Message, RpcError
from ballast.mcp.upstream import McpUpstream, ServerDown
from ballast.observe.metrics import Metrics
from ballast.observe.tracing import Tracer
from ballast.pipeline.access import MASTER, Access
from ballast.pipeline.errors import ApiError
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.keys import KeyRecord

log = logging.getLogger("ballast.mcp")

SERVER_INFO = {"name": "ballast", "version": __version__}
CAPABILITIES: dict[str, Any] = {"tools": {}, "prompts": {}, "resources": {}}
RATE_LIMITED = -32029  # Ballast's: the key's rate limit refused the call


@dataclass(slots=True)
class Call:
    """One client request as the methods see it."""

    message: Message
    key: KeyRecord | None
    holder: str  # the client session (its upstream sessions' holder), or the gateway's
    modern: bool  # the client speaks the stateless revision


def key_label(key: KeyRecord | None) -> str:
    return "-" if key is None else "master" if key is MASTER else key.id


class Methods:
    """The answer to each method a client may send, once its key and session are known."""

    def __init__(
        self,
        catalog: Catalog,
        access: Callable[[], Access | None],
        metrics: Metrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        tracer: Tracer | None = None,
        key_series: Callable[[str], str] | None = None,
    ) -> None:
        self.catalog = catalog
        # A key's label in the metrics, as the requests' (`observe.per_key_metrics`, ...).
        self._key_series = key_series
        self.tracer = tracer  # a span per tool call when tracing is on
        self._access = access
        self._metrics = metrics
        self._clock = clock

    async def answer(self, call: Call) -> dict[str, Any]:
        """The result of `call`'s method; RpcError for what is not one."""
        method = call.message.method
        if method in LISTS:
            found = await self.catalog.merged(call.holder, method, call.key)
            if call.modern:  # filtered per key: no cache may share it
                found.update(ttlMs=0, cacheScope="private")
            return found
        if method == "tools/call":
            return await self._call_tool(call)
        if method == "prompts/get":
            return await self._routed(call, "prompt", "name")
        if method == "resources/read":
            return await self._read(call)
        if method == "server/discover":
            return self.discover()
        if method in ("ping", "logging/setLevel"):
            return {}
        raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"Unknown method '{str(method)[:100]}'.")

    def initialize(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the revision agreed, the result): the client's, when Ballast speaks it."""
        asked = params.get("protocolVersion")
        version = asked if asked in jsonrpc.HANDSHAKE_VERSIONS else jsonrpc.LATEST_HANDSHAKE
        return version, {
            "protocolVersion": version,
            "capabilities": CAPABILITIES,
            "serverInfo": SERVER_INFO,
        }

    def discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": [*jsonrpc.HANDSHAKE_VERSIONS, *jsonrpc.MODERN_VERSIONS],
            "capabilities": CAPABILITIES,
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
            "ttlMs": 0,
            "cacheScope": "private",
        }

    async def _call_tool(self, call: Call) -> dict[str, Any]:
        name = call.message.params.get("name")
        if not isinstance(name, str):
            raise RpcError(jsonrpc.INVALID_PARAMS, "tools/call needs the tool's name.")
        upstream, tool = self.catalog.route(name, call.key, "tool")
        access = self._access()
        lease = None
        if access is not None and call.key is not None:
            try:
                lease = await access.limit_call(call.key)
            except ApiError as refused:
                self._count(upstream.name, tool, call.key, "rate_limited", None)
                raise RpcError(RATE_LIMITED, refused.message) from None
        started = self._clock.monotonic()
        tracer = self.tracer
        try:
            if tracer is None:
                answer, outcome = await self._tool_answer(call, upstream, tool)
            else:
                labels = {"server": upstream.name, "tool": tool, "key": key_label(call.key)}
                with tracer.span("ballast.mcp.tool_call", **labels) as span:
                    answer, outcome = await self._tool_answer(call, upstream, tool)
                    span.set_attribute("ballast.outcome", outcome)
        finally:
            if access is not None:
                access.release_call(lease)
        self._count(upstream.name, tool, call.key, outcome, started)
        return _result(answer, upstream)

    async def _tool_answer(
        self, call: Call, upstream: McpUpstream, tool: str
    ) -> tuple[dict[str, Any], str]:
        """The server's answer to the call and its outcome's label; a server that gave none
        answers a tool error that says why."""
        settings = upstream.settings
        tries = 2 if tool in settings.idempotent_tools else 1
        params = {**call.message.params, "name": tool}
        try:
            answer = await upstream.request(
                call.holder, "tools/call", params, settings.timeout_for(tool), tries
            )
        except ServerDown as down:
            return {"result": jsonrpc.tool_error(down.message)}, down.kind
        result = answer.get("result")
        if not isinstance(result, dict):
            return answer, "error"
        return answer, "tool_error" if result.get("isError") else "ok"

    async def _routed(self, call: Call, what: str, field: str) -> dict[str, Any]:
        params = call.message.params
        name = params.get(field)
        if not isinstance(name, str):
            raise RpcError(jsonrpc.INVALID_PARAMS, f"A {what} needs its {field}.")
        upstream, own = self.catalog.route(name, call.key, what)
        return await self._forward(call, upstream, {**params, field: own})

    async def _read(self, call: Call) -> dict[str, Any]:
        uri = call.message.params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(jsonrpc.INVALID_PARAMS, "resources/read needs a uri.")
        upstream = self.catalog.resource(uri, call.key)
        return await self._forward(call, upstream, call.message.params)

    async def _forward(
        self, call: Call, upstream: McpUpstream, params: dict[str, Any]
    ) -> dict[str, Any]:
        method = call.message.method
        assert method is not None
        try:
            answer = await upstream.request(
                call.holder, method, params, upstream.settings.call_timeout
            )
        except ServerDown as down:
            raise RpcError(jsonrpc.INTERNAL_ERROR, down.message) from None
        return _result(answer, upstream)

    def _count(
        self, server: str, tool: str, key: KeyRecord | None, outcome: str, started: float | None
    ) -> None:
        elapsed = self._clock.monotonic() - started if started is not None else 0.0
        log.info(
            "mcp tools/call server=%s tool=%s key=%s outcome=%s ms=%.1f",
            server,
            tool[:100],
            key_label(key),
            outcome,
            elapsed * 1000,
        )
        metrics = self._metrics
        if metrics is not None:
            series = self._key_series
            label = key_label(key) if series is None else series(key_label(key))
            # A tool a client made up is `other`: labels take only what a server listed.
            tool = self.catalog.tool_label(server, tool)
            metrics.mcp_calls.labels(server, tool, label, outcome).inc()
            if started is not None:
                metrics.mcp_latency.labels(server).observe(elapsed)


def _result(answer: dict[str, Any], upstream: McpUpstream) -> dict[str, Any]:
    """The server's result, or its error passed on as the client's JSON-RPC error."""
    result = answer.get("result")
    if isinstance(result, dict):
        return result
    error = answer.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), int):
        message = str(error.get("message", ""))[:1000]
        raise RpcError(error["code"], message, data=error.get("data"))
    raise RpcError(jsonrpc.INTERNAL_ERROR, f"MCP server {upstream.name} gave no result.")

"""Many servers as one: their lists merged under prefixed names, and a call routed back by
its prefix. One server down never hides the others: its part of a list is left out (or, with
`on_server_down: error`, its last known part is kept, and a call to it fails fast)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from ballast.config import McpSettings
from ballast.mcp import jsonrpc
from ballast.mcp.jsonrpc import RpcError
from ballast.mcp.upstream import McpUpstream, ServerDown
from ballast.state.keys import KeyRecord

log = logging.getLogger("ballast.mcp")

# What each list method returns, and the field that names an item (None: not renamed).
LISTS = {
    "tools/list": ("tools", "name"),
    "prompts/list": ("prompts", "name"),
    "resources/list": ("resources", None),
    "resources/templates/list": ("resourceTemplates", None),
}
MAX_PAGES = 20  # pages read from one server for one list
MAX_REMEMBERED = 100_000  # shortened names and resource URIs kept to route calls back


class Names:
    """`<server><separator><name>` and back. A name past `max_length` is cut and ends in a
    hash of the whole, so it stays unique, and is remembered to be routed back."""

    def __init__(self, separator: str, max_length: int) -> None:
        self.separator = separator
        self.max_length = max_length
        self._shortened: dict[str, tuple[str, str]] = {}

    def public(self, server: str, name: str) -> str:
        full = f"{server}{self.separator}{name}"
        if len(full) <= self.max_length:
            return full
        digest = hashlib.sha256(full.encode()).hexdigest()[:8]
        short = f"{full[: self.max_length - 9]}_{digest}"
        if len(self._shortened) >= MAX_REMEMBERED:
            self._shortened.clear()
        self._shortened[short] = (server, name)
        return short

    def split(self, public: str) -> tuple[str, str] | None:
        found = self._shortened.get(public)
        if found is not None:
            return found
        server, sep, name = public.partition(self.separator)
        return (server, name) if sep and name else None


def may_use_server(key: KeyRecord | None, server: str) -> bool:
    """Whether all of `server` (its prompts and resources too) is open to the key."""
    return key is None or key.mcp is None or server in key.mcp


def may_use_tools(key: KeyRecord | None, server: str) -> bool:
    """Whether any tool of `server` is open to the key (the server, or one of its tools)."""
    if key is None or key.mcp is None:
        return True
    prefix = server + "/"
    return any(entry == server or entry.startswith(prefix) for entry in key.mcp)


def may_call(key: KeyRecord | None, server: str, tool: str) -> bool:
    return key is None or key.allows_tool(server, tool)


class Catalog:
    """The servers' lists as one, and the way back from a public name to its server."""

    def __init__(self, settings: McpSettings, upstreams: dict[str, McpUpstream]) -> None:
        self.upstreams = upstreams
        self.names = Names(settings.separator, settings.max_name_length)
        self.keep_down = settings.on_server_down == "error"
        self._known: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._resources: dict[str, str] = {}  # resource URI -> its server
        self._tools: dict[str, frozenset[str]] = {}  # each server's tools, as last listed

    async def merged(self, holder: str, method: str, key: KeyRecord | None) -> dict[str, Any]:
        """A list method's answer: every server's items the key may see, renamed."""
        field, named = LISTS[method]
        open_to = may_use_tools if method == "tools/list" else may_use_server
        servers = [u for u in self.upstreams.values() if open_to(key, u.name)]
        parts = await asyncio.gather(*(self._part(holder, u, method, field) for u in servers))
        items: list[dict[str, Any]] = []
        for upstream, part in zip(servers, parts, strict=True):
            server = upstream.name
            for item in part:
                if named is None:
                    self._remember(item, server)
                    items.append(item)
                    continue
                name = item.get(named)
                if not isinstance(name, str):
                    continue
                if method == "tools/list" and not may_call(key, server, name):
                    continue
                items.append({**item, named: self.names.public(server, name)})
        return {field: items}

    def _remember(self, item: dict[str, Any], server: str) -> None:
        uri = item.get("uri") or item.get("uriTemplate")
        if isinstance(uri, str):
            if len(self._resources) >= MAX_REMEMBERED:
                self._resources.clear()
            self._resources.setdefault(uri, server)

    async def _part(
        self, holder: str, upstream: McpUpstream, method: str, field: str
    ) -> list[dict[str, Any]]:
        """One server's items; on failure its last known ones (kept) or none (hidden)."""
        known = (upstream.name, method)
        try:
            items = await self._pages(holder, upstream, method, field)
        except ServerDown as down:
            log.warning("MCP server %s left out of %s: %s", upstream.name, method, down.kind)
            return self._known.get(known, []) if self.keep_down else []
        self._known[known] = items
        if method == "tools/list":
            self._tools[upstream.name] = frozenset(
                name for item in items if isinstance(name := item.get("name"), str)
            )
        return items

    async def _pages(
        self, holder: str, upstream: McpUpstream, method: str, field: str
    ) -> list[dict[str, Any]]:
        settings = upstream.settings
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        for _ in range(MAX_PAGES):
            answer = await upstream.request(
                holder, method, params, settings.list_timeout, 1 + settings.list_retries
            )
            result = answer.get("result")
            if not isinstance(result, dict):
                error = answer.get("error")
                if isinstance(error, dict) and error.get("code") == jsonrpc.METHOD_NOT_FOUND:
                    return items  # the server offers no such list
                raise ServerDown(upstream.name, "error", f"{method} failed")
            page = result.get(field)
            if isinstance(page, list):
                items.extend(item for item in page if isinstance(item, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
            params = {"cursor": cursor}
        return items

    def route(self, public: str, key: KeyRecord | None, what: str) -> tuple[McpUpstream, str]:
        """The server and its own name for a prefixed name; RpcError naming it otherwise."""
        found = self.names.split(public)
        upstream = self.upstreams.get(found[0]) if found is not None else None
        if found is None or upstream is None:
            raise RpcError(jsonrpc.INVALID_PARAMS, f"Unknown {what} '{public[:200]}'.")
        server, name = found
        allowed = may_call(key, server, name) if what == "tool" else may_use_server(key, server)
        if not allowed:
            shown = public[:200]
            raise RpcError(jsonrpc.UNAUTHORIZED, f"This key may not use the {what} '{shown}'.")
        return upstream, name

    def resource(self, uri: str, key: KeyRecord | None) -> McpUpstream:
        """The server a resource came from (as its last list said)."""
        server = self._resources.get(uri)
        upstream = self.upstreams.get(server) if server is not None else None
        if upstream is None or not may_use_server(key, upstream.name):
            raise RpcError(jsonrpc.INVALID_PARAMS, f"Unknown resource '{uri[:200]}'.")
        return upstream

    def tool_label(self, server: str, tool: str) -> str:
        """`tool` as a metric label: its name when the server listed it, else `other`."""
        return tool if tool in self._tools.get(server, ()) else "other"

"""JSON-RPC 2.0 as MCP uses it: one message per POST (batches are refused, as from revision
2025-06-18 on), the protocol revisions Ballast speaks, and the few answers it writes itself.

A message is parsed once, here; what the gateway forwards is rebuilt from that parse only
where it changes (a tool's name without its prefix, the upstream's `_meta`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Revisions reached through `initialize` (sessions) and the stateless one.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
MODERN = "2026-07-28"
MODERN_VERSIONS = (MODERN,)

# `_meta` keys of a stateless (2026-07-28) request.
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT = "io.modelcontextprotocol/clientInfo"
ENVELOPE = frozenset((META_VERSION, META_CAPABILITIES, META_CLIENT))

# Which parameter a name-bearing method's `Mcp-Name` header mirrors.
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_BUSY = -32000  # Ballast's: at its bound of requests at once
UNAUTHORIZED = -32001  # Ballast's: the key was refused, or may not use what it named
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022

Id = str | int | None


class RpcError(Exception):
    """An error the client gets as a JSON-RPC error object (and an HTTP status)."""

    def __init__(self, code: int, message: str, status: int = 200, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.data = data

    def body(self, id_: Id) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": id_, "error": error}


@dataclass(slots=True)
class Message:
    """One client message: a request (it has an id), a notification, or an answer to a
    request of the server's (which Ballast never sends, so it is dropped)."""

    method: str | None
    id: Id
    params: dict[str, Any]
    is_request: bool

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}


def parse(body: bytes) -> Message:
    """The message in `body`; RpcError (HTTP 400) for anything that is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RpcError(PARSE_ERROR, "The body is not valid JSON.", 400) from None
    if isinstance(data, list):
        raise RpcError(INVALID_REQUEST, "JSON-RPC batches are not supported.", 400)
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message.", 400)
    id_ = data.get("id")
    if id_ is not None and (type(id_) not in (str, int)):
        raise RpcError(INVALID_REQUEST, "A request id must be a string or an integer.", 400)
    method = data.get("method")
    if method is None:
        if "result" in data or "error" in data:
            return Message(None, id_, {}, False)
        raise RpcError(INVALID_REQUEST, "A JSON-RPC message needs a method.", 400)
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "A method must be a string.", 400)
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object.", 400)
    return Message(method, id_, params, "id" in data)


def result(id_: Id, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def tool_error(text: str) -> dict[str, Any]:
    """A tools/call result that says the call failed: the model reads it and may go on."""
    return {"content": [{"type": "text", "text": text}], "isError": True}


def request(id_: Id, method: str, params: dict[str, Any] | None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message)


def notification(method: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method})

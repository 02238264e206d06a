"""`/mcp` toward a client, in process: bad input gets a clear JSON-RPC error with the right
HTTP status, sessions are handed out and ended, and the stateless revision's headers must
agree with the body. No server is needed for any of it."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from ballast.config import Settings, parse_settings
from ballast.mcp.gateway import McpGateway
from ballast.resilience.clock import ManualClock
from tests.unit.drive import Client, settings_tree, started

pytestmark = pytest.mark.asyncio

SERVERS = [{"name": "alpha", "url": "http://127.0.0.1:9/mcp"}]


def settings_of(servers: list[dict[str, Any]], **mcp: Any) -> Settings:
    return parse_settings(
        {
            "models": [{"name": "m", "deployments": [{"id": "d", "url": "http://127.0.0.1:9"}]}],
            "mcp": {"servers": servers, **mcp},
        }
    )


def make(**mcp: Any) -> McpGateway:
    return McpGateway(settings_of(SERVERS, **mcp))


async def call(
    gateway: McpGateway,
    body: Any,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, dict[str, str], Any]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    scope = {
        "type": "http",
        "method": method,
        "path": "/mcp",
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await gateway(scope, receive, send)
    start, answer = sent
    found = {k.decode(): v.decode() for k, v in start["headers"]}
    raw = answer["body"]
    if found.get("content-type") == "text/event-stream":
        return start["status"], found, raw
    return start["status"], found, orjson.loads(raw) if raw else None


def request(method: str, id_: int = 1, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


async def test_malformed_json_is_a_parse_error() -> None:
    status, _, body = await call(make(), b"{not json")
    assert (status, body["error"]["code"]) == (400, -32700)


async def test_a_batch_is_refused() -> None:
    status, _, body = await call(make(), [request("ping"), request("ping", 2)])
    assert status == 400 and body["error"]["code"] == -32600
    assert "batches" in body["error"]["message"]


async def test_a_message_past_the_bound_is_refused() -> None:
    huge = orjson.dumps(request("ping", text="x" * 5000))
    status, _, body = await call(make(max_message_bytes=1024), huge)
    assert status == 413 and body["error"]["code"] == -32600


async def test_an_unknown_method_is_method_not_found() -> None:
    status, _, body = await call(make(), request("tools/frobnicate"))
    assert (status, body["id"], body["error"]["code"]) == (200, 1, -32601)


async def test_a_tool_name_with_no_known_prefix_is_an_error_naming_it() -> None:
    for name in ("gamma__echo", "echo"):
        status, _, body = await call(make(), request("tools/call", name=name, arguments={}))
        assert status == 200 and body["error"]["code"] == -32602
        assert f"'{name}'" in body["error"]["message"]


async def test_a_notification_gets_202() -> None:
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status, _, body = await call(make(), note)
    assert (status, body) == (202, None)


async def test_a_session_is_handed_out_used_and_ended() -> None:
    gateway = make()
    hello = request("initialize", protocolVersion="2025-06-18", capabilities={})
    status, headers, body = await call(gateway, hello)
    assert status == 200 and body["result"]["protocolVersion"] == "2025-06-18"
    session = {"mcp-session-id": headers["mcp-session-id"]}
    assert (await call(gateway, request("ping"), session))[0] == 200
    assert (await call(gateway, b"", session, "DELETE"))[0] == 204
    status, _, body = await call(gateway, request("ping"), session)
    assert status == 404 and body["error"]["message"] == "Session not found."


async def test_an_unknown_session_is_404() -> None:
    status, _, _ = await call(make(), request("ping"), {"mcp-session-id": "nope"})
    assert status == 404


async def test_stateless_headers_must_agree_with_the_body() -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    body = request("tools/call", name="alpha__echo", _meta=meta)
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}
    for wrong in ({"mcp-name": "alpha__add"}, {"mcp-method": "tools/list"}, {}):
        status, _, answer = await call(make(), body, {**headers, **wrong})
        assert status == 400 and answer["error"]["code"] == -32020


async def test_an_unknown_protocol_version_is_refused() -> None:
    status, _, body = await call(make(), request("ping"), {"mcp-protocol-version": "1999-01-01"})
    assert status == 400 and body["error"]["code"] == -32022


async def test_discover_names_both_revisions() -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "server/discover"}
    status, _, body = await call(make(), request("server/discover", _meta=meta), headers)
    assert status == 200
    assert body["result"]["supportedVersions"][-2:] == ["2025-11-25", "2026-07-28"]


async def test_get_is_not_offered() -> None:
    status, headers, _ = await call(make(), b"", method="GET")
    assert status == 405 and headers["allow"] == "POST, DELETE"


async def test_a_client_that_takes_only_a_stream_gets_one_event() -> None:
    status, headers, body = await call(make(), request("ping"), {"accept": "text/event-stream"})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert body == b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'


async def test_a_reload_keeps_an_unchanged_server_and_starts_a_changed_one_afresh() -> None:
    gateway = make()
    await gateway.start()
    alpha = gateway.upstreams["alpha"]
    beta = {"name": "beta", "url": "http://127.0.0.1:9/beta"}
    assert await gateway.reconfigure(settings_of([*SERVERS, beta])) == []
    assert gateway.upstreams["alpha"] is alpha and "beta" in gateway.upstreams
    added = gateway.upstreams["beta"]
    changed = [{**SERVERS[0], "call_timeout": 5}]
    gone = await gateway.reconfigure(settings_of(changed))
    assert gone == [alpha, added]
    assert gateway.upstreams["alpha"] is not alpha
    assert gateway.upstreams["alpha"].settings.call_timeout == 5
    _, _, body = await call(gateway, request("tools/call", name="beta__echo"))
    assert "Unknown tool 'beta__echo'" in body["error"]["message"]
    await gateway.close()
    for upstream in gone:
        await upstream.close()


async def test_mcp_is_held_to_the_apps_bound_of_requests_at_once(tmp_path: Path) -> None:
    tree = settings_tree(tmp_path, "http://127.0.0.1:9/v1", max_in_flight=1)
    tree["mcp"] = {"servers": SERVERS}
    app = await started(tree, ManualClock())
    try:
        app.in_flight = 1  # one request running already
        busy = Client(app, "POST", "/mcp", [orjson.dumps(request("ping"))])
        await busy.done()
        start, answer = busy.sent
        assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
        assert orjson.loads(answer["body"])["error"]["code"] == -32000
        app.in_flight = 0
        served = Client(app, "POST", "/mcp", [orjson.dumps(request("ping"))])
        await served.done()
        assert served.sent[0]["status"] == 200 and app.in_flight == 0
    finally:
        await app.shutdown()

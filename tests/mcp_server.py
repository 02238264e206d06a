"""An MCP tool server for tests, built with the official SDK and served by uvicorn on a
loopback port: it records the headers of every request it got, counts the sessions it
opened, and can restart (a new session manager on the same port: every session id it gave
out answers 404 from then on, as a real server's restart does), on its own too: right before
the n-th `tools/call` it receives, for a client it cannot be told when to."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ballast.types import Message, Receive, Scope, Send


class ToolServer:
    """`tools`: each an (async or plain) function, registered by its own name."""

    def __init__(
        self, name: str, *tools: Any, json_response: bool = False, stateless: bool = False
    ) -> None:
        self.name = name
        self.mcp = MCPServer(name)
        for tool in tools:
            self.mcp.tool()(tool)
        # Every server has one prompt and one resource of its own, to list and to route.

        def greet(who: str) -> str:
            """Greet someone."""
            return f"{name} greets {who}"

        def note() -> str:
            return f"a note from {name}"

        self.mcp.prompt()(greet)
        self.mcp.resource(f"note://{name}")(note)
        self.json_response = json_response
        self.stateless = stateless  # no session ids at all
        self.received: list[dict[str, str]] = []  # each request's headers, and its ":method"
        self.initializes = 0
        self.calls = 0  # `tools/call` requests received
        self.restart_on_call: int | None = None  # restart before serving this call
        self.status: int | None = None  # answer every request with this status instead
        self._manager: StreamableHTTPSessionManager | None = None
        self._stop: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> ToolServer:
        await self._open_sessions()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app, interface="asgi3", lifespan="off", log_level="warning", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._serving = asyncio.get_running_loop().create_task(self._server.serve([sock]))
        for _ in range(500):
            if self._server.started:
                break
            await asyncio.sleep(0.01)
        return self

    async def restart(self) -> None:
        """Forget every session, as a restarted server does."""
        await self._close_sessions()
        await self._open_sessions()

    async def close(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._serving, 10)
        await self._close_sessions()

    async def _open_sessions(self) -> None:
        manager = StreamableHTTPSessionManager(
            app=self.mcp._lowlevel_server,
            json_response=self.json_response,
            stateless=self.stateless,
        )
        ready = asyncio.Event()
        self._stop = stop = asyncio.Event()

        async def run() -> None:
            async with manager.run():
                ready.set()
                await stop.wait()

        self._runner = asyncio.get_running_loop().create_task(run())
        await ready.wait()
        self._manager = manager

    async def _close_sessions(self) -> None:
        if self._stop is not None and self._runner is not None:
            self._stop.set()
            await self._runner
        self._manager = None

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.received.append({":method": scope["method"], **headers})
        if self.status is not None:
            await send({"type": "http.response.start", "status": self.status, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if b'"initialize"' in body:
            self.initializes += 1
        if b'"tools/call"' in body:
            self.calls += 1
            if self.calls == self.restart_on_call:
                await self.restart()
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        assert self._manager is not None
        await self._manager.handle_request(scope, replay, send)

"""Drives a BallastApp through its ASGI callable, in process: a client that sends the body it
is given and then waits (until it leaves), and an app started on a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import orjson

from ballast.app import BallastApp
from ballast.config import parse_settings
from ballast.resilience.clock import ManualClock


class Client:
    """One request: the body in the given parts, then silence until `leave()` (a disconnect).
    `received` counts the app's calls of `receive`."""

    def __init__(
        self,
        app: BallastApp,
        method: str,
        path: str,
        parts: list[bytes],
        complete: bool = True,
        headers: list[tuple[bytes, bytes]] | None = None,
        query: bytes = b"",
    ) -> None:
        self.scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "headers": headers or [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
        }
        self._pending: list[dict[str, Any]] = [
            {"type": "http.request", "body": part, "more_body": not complete or i < len(parts) - 1}
            for i, part in enumerate(parts or [b""])
        ]
        self._gone = asyncio.Event()
        self.received = 0
        self.sent: list[dict[str, Any]] = []
        self.task = asyncio.get_running_loop().create_task(app(self.scope, self.receive, self.send))

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        if self._pending:
            return self._pending.pop(0)
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(dict(message))

    def leave(self) -> None:
        self._gone.set()

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    def json(self) -> Any:
        return orjson.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))

    async def done(self) -> None:
        await asyncio.wait_for(self.task, 5)


async def turns(n: int = 20) -> None:
    """Let the loop run what is ready, without letting real time matter."""
    for _ in range(n):
        await asyncio.sleep(0)


def settings_tree(tmp: Path, url: str, **server: Any) -> dict[str, Any]:
    return {
        "server": {"body_timeout": 30.0, **server},
        "state": {
            "database_url": f"sqlite+aiosqlite:///{tmp / 'clock.db'}",
            "spend_journal": str(tmp / "spend.journal"),
        },
        "upstream": {"warm_connections": 0},
        "timeouts": {"connect": 600, "first_token": 600, "inter_chunk": 600, "request": 600},
        "models": [{"name": "chat", "deployments": [{"id": "a", "url": url}]}],
    }


async def started(tree: dict[str, Any], clock: ManualClock) -> BallastApp:
    app = BallastApp(parse_settings(tree, environ={}), clock=clock)
    await app.startup()
    return app

"""The floor: a featureless pass-through that shows what Python itself costs.

uvicorn (httptools, uvloop) serving a raw ASGI app with one pooled aiohttp session (no
connection limit, like Ballast's in the long-stream bench, so no stream waits for a slot):
it forwards the POST body to ``BARE_UPSTREAM`` + the request path and relays status and
body; event streams are relayed chunk by chunk. Usage:
``python bench/bare_passthrough.py PORT [UPSTREAM_BASE_URL]``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import aiohttp
import uvicorn

UPSTREAM = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("BARE_UPSTREAM", "")
FORWARD = (b"authorization", b"content-type")
state: dict[str, aiohttp.ClientSession] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=300)
                state["s"] = aiohttp.ClientSession(connector=connector)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["s"].close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in FORWARD}
    async with state["s"].post(UPSTREAM + scope["path"], data=body, headers=headers) as resp:
        ctype = resp.headers.get("Content-Type", "application/json").encode()
        out = [(b"content-type", ctype)]
        if ctype.startswith(b"text/event-stream"):
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        data = await resp.read()
        out.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        await send({"type": "http.response.body", "body": data})


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        http="httptools",
        loop="uvloop",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )

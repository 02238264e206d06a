"""One uvicorn protocol class serving one app on a loopback port, as a test needs it."""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState


async def listen(protocol: type[HttpToolsProtocol], config: Config) -> asyncio.Server:
    """A server of `protocol` for `config`'s app on 127.0.0.1 (its port: the first socket's)."""
    config.load()
    state = ServerState()
    return await asyncio.get_running_loop().create_server(
        lambda: protocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0
    )

"""The ASGI contract, declared once (as Starlette's `types.py` does): every layer that
speaks ASGI takes its types from here, so none needs to import the API layer for them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

# A scope key: the client connection's abort, set by Ballast's server protocol
# (server/protocol.py) for a stream cut short to drop its connection at once.
ABORT = "ballast.abort"

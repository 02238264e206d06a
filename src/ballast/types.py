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

# A scope key set by Ballast's server protocol (server/protocol.py) when it aborted a client
# connection whose writes stayed paused for `client_write_timeout` (the client stopped
# reading): the disconnect the app sees then is counted as such.
WRITE_TIMED_OUT = "ballast.write_timed_out"

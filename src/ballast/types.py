"""The ASGI contract, declared once (as Starlette's `types.py` does): every layer that
speaks ASGI takes its types from here, so none needs to import the API layer for them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

# A scope key set by Ballast's server protocol (server/protocol.py) when it aborted a client
# connection whose writes stayed paused for `client_write_timeout` (the client stopped
# reading): the disconnect the app sees then is counted as such.
WRITE_TIMED_OUT = "ballast.write_timed_out"

# A scope key set by Ballast's server protocol: a `BodyWriter` for the response of this
# request. Absent under other servers, where every body goes through `send`.
BODY_WRITER = "ballast.body_writer"


class BodyWriter(Protocol):
    """A started, chunked streaming response's body written without `send`: for a relay that
    forwards each upstream chunk from the connection's own callback, so no task wakes and no
    coroutine runs per chunk. The server's framing and flow control, nothing else: what the
    app wraps around `send` does not see these bytes."""

    @property
    def open(self) -> bool:
        """The response is a started chunked body and its client is still there."""
        ...

    @property
    def body_complete(self) -> bool:
        """The request's whole body has arrived: reading it cannot trickle (no timer)."""
        ...

    def write(self, body: bytes) -> bool:
        """Write `body` as one chunk; False once the client's buffer is full (wait in `drain`
        before writing more) or the client has gone."""
        ...

    async def drain(self) -> None:
        """Until the client's buffer has room again, or the client is gone."""
        ...

    def cork(self) -> None:
        """Hold what `send` writes until `uncork`: a whole answer's head and body then leave
        in one write (one system call, one segment) instead of two."""
        ...

    def uncork(self) -> None:
        """Write what was held, at once, and write through again."""
        ...

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """A response's head written at once, as `send` would write it (a stream's: its
        body then follows by `write` or `send`); False when it must go through `send`
        after all (nothing is written then)."""
        ...

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole response (`headers` give the body's content-length) written at once, as
        `send` would write it, and the request's cycle ended; False when it must go through
        `send` after all (nothing is written then)."""
        ...

    def on_disconnect(self, callback: Callable[[], None] | None) -> bool:
        """Call `callback` once, from the server's own callback, when the client's
        connection is lost (None: no longer): the app learns of a client that left without
        a task waiting on `receive` or a timer per request. False when the client is
        already gone; nothing is registered then."""
        ...

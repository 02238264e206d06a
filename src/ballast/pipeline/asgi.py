"""The few ASGI moves every handler needs: read a bounded body, send a whole answer, and
notice a client that went away."""

from __future__ import annotations

import asyncio

from ballast.pipeline.errors import ApiError
from ballast.resilience.clock import SYSTEM_CLOCK, Clock, Timer
from ballast.types import (
    BODY_WRITER,
    WRITE_TIMED_OUT,
    BodyWriter,
    Handler,
    Message,
    Receive,
    Scope,
    Send,
)

__all__ = ["WRITE_TIMED_OUT", "Handler", "Message", "Receive", "Scope", "Send"]


JSON = (b"content-type", b"application/json")
EVENT_STREAM = (b"content-type", b"text/event-stream")
NO_CACHE = (b"cache-control", b"no-cache")


class ClientGone(Exception):
    """The client disconnected before its request was read."""


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def require_json(scope: Scope) -> None:
    """415 for a body declared as something other than JSON (a form, multipart, text).
    A request without a content-type is read as JSON, as OpenAI's own clients send it."""
    given = header(scope, b"content-type")
    if given is None or given.startswith(b"application/json"):
        return
    kind = given.split(b";", 1)[0].strip().lower()
    if kind == b"application/json" or kind.endswith(b"+json"):
        return
    raise ApiError(
        415,
        f"Unsupported content type '{kind[:100].decode('latin-1')}': send the request body "
        "as JSON with 'content-type: application/json'.",
        code="unsupported_media_type",
    )


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit} bytes.", code="body_too_large")


def body_timed_out(timeout: float) -> ApiError:
    """408 for a body that did not arrive in time; the connection is closed after it."""
    return ApiError(
        408,
        f"The request body did not arrive within {timeout:g}s.",
        code="request_timeout",
        headers=((b"connection", b"close"),),
    )


async def read_body(
    scope: Scope, receive: Receive, limit: int, seconds: float = 30.0, clock: Clock = SYSTEM_CLOCK
) -> bytes:
    """The whole body, at most `limit` bytes, received within `seconds` on `clock` (a client
    trickling its body is cut off with 408 instead of holding the request open)."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    writer = scope.get(BODY_WRITER)
    if writer is not None and writer.body_complete:
        # Our server says the whole body is already here (the usual case for a small POST):
        # nothing can trickle, so no timer. Any other server gets the timer.
        return await _receive_body(receive, limit)
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    cancelling = task.cancelling()
    timer = clock.call_later(seconds, expire)
    try:
        return await _receive_body(receive, limit)
    except asyncio.CancelledError:
        if fired and task.uncancel() <= cancelling:
            raise body_timed_out(seconds) from None
        raise
    finally:
        timer.cancel()


async def _receive_body(receive: Receive, limit: int) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise _too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def send_bytes(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: ApiError, extra: list[tuple[bytes, bytes]]) -> None:
    await send_bytes(send, error.status, [JSON, *error.headers, *extra], error.body())


# A request still in flight after this long gets a task that waits for the client to go away.
# Most answers finish sooner, and then cost one timer instead of a task (and its cancellation).
WATCH_AFTER = 0.05


class DisconnectWatch:
    """Cancels the handler's task when the client disconnects, so an upstream request made
    for nobody is dropped at once (no tokens generated for nobody). Under Ballast's server
    the connection itself says so (the body `writer`'s `on_disconnect`): no timer, no task.
    Under another server a watching task reads `receive`, started only after `delay`
    seconds on `clock`, so a quick answer never pays for one."""

    __slots__ = ("_receive", "_stopped", "_task", "_timer", "_watcher", "_writer", "fired")

    def __init__(
        self,
        receive: Receive,
        clock: Clock = SYSTEM_CLOCK,
        delay: float = WATCH_AFTER,
        writer: BodyWriter | None = None,
    ) -> None:
        self.fired = False
        self._stopped = False
        self._receive = receive
        self._task = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None
        self._timer: Timer | None = None
        self._writer: BodyWriter | None = None
        if writer is not None and writer.on_disconnect(self._gone):
            self._writer = writer
        else:
            self._timer = clock.call_later(delay, self._start)

    def _gone(self) -> None:
        if not self._stopped:
            self.fired = True
            if self._task is not None:
                self._task.cancel()

    def _start(self) -> None:
        self._timer = None
        if not self._stopped:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        receive = self._receive
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._gone()
                return

    def stop(self) -> None:
        """Idempotent; it must run however the request ends: a writer's callback holds
        this watch, which holds the connection's `receive` (a cycle until then)."""
        self._stopped = True
        if self._writer is not None:
            self._writer.on_disconnect(None)
            self._writer = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None  # the cancelled task's traceback holds this watch

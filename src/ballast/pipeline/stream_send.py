"""The client's side of one stream: the relay's typed chat events in, the client's bytes out.

Everything that reads or reshapes a stream on its way to the client is here, in one order:
the response cache's recorder keeps every event, usage the client did not ask for is left
out, and the shape's translator (if the client speaks another API) turns the rest into its
events; for OpenAI's shape the events' own bytes go out. Each reads the events' parsed data,
so nothing here parses an event again. A stream broken past healing ends with its error,
made once in the client's shape. The relay's fast path (UpstreamStream.pump) encodes its
chunks here too, from the upstream connection's callback."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any

from ballast.pipeline.errors import ApiError
from ballast.pipeline.shape import Rendering, StreamTranslator
from ballast.stream.event import StreamEvent, events_of, raw, usage_only
from ballast.types import Message, Send

if TYPE_CHECKING:
    from ballast.pipeline.caching import StreamRecorder


class _Nothing:
    """An awaitable that is done at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_NOTHING = _Nothing()


class StreamSend:
    """One stream's encoder and sender. `send` is the ASGI send for what is not an event of
    the relay's (the response's start, keep-alive comments)."""

    __slots__ = ("_send", "recorder", "shape", "strip_usage", "translator")

    def __init__(
        self,
        send: Send,
        shape: Rendering,
        translator: StreamTranslator | None = None,
        recorder: StreamRecorder | None = None,
        strip_usage: bool = False,
    ) -> None:
        self._send = send
        self.shape = shape
        self.translator = translator
        self.recorder = recorder
        # Usage was asked of the upstream for accounting, not by the client: keep it from them.
        self.strip_usage = strip_usage

    def encode(self, events: list[StreamEvent]) -> bytes:
        """The client's bytes for these events (recorded first when the cache keeps them)."""
        if self.recorder is not None:
            self.recorder.events.extend(events)
        if self.strip_usage:
            events = [e for e in events if not usage_only(e)]
        translator = self.translator
        if translator is None:
            return raw(events)
        return translator.feed(events) if events else b""

    def events(self, events: list[StreamEvent], more: bool) -> Awaitable[None]:
        """Sends the events; the last piece (`more` False) ends the shape's stream, and the
        recorder keeps the whole answer before those bytes go out. (No coroutine of its own
        but for that last piece: it runs once per piece.)"""
        body = self.encode(events)
        if more:
            if not body:
                return _NOTHING  # nothing to say yet (an event the shape has no counterpart for)
            return self._send({"type": "http.response.body", "body": body, "more_body": True})
        if self.translator is not None:
            body += self.translator.finish()
        if self.recorder is not None:
            return self._last(self.recorder, body)
        return self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _last(self, recorder: StreamRecorder, body: bytes) -> None:
        await recorder.store()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def fail(self, error: ApiError) -> None:
        """Ends a started stream with `error`, in the client's shape."""
        translator = self.translator
        body = self.shape.error_event(error) if translator is None else translator.fail(error)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and self.translator is not None:
            more = message.get("more_body", False)
            body = self.translator.feed(events_of(message.get("body", b"")))
            if not more:
                body += self.translator.finish()
            elif not body:
                return
            message = {"type": "http.response.body", "body": body, "more_body": more}
        await self._send(message)

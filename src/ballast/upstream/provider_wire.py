"""The seam between the transport and a provider that speaks another wire than OpenAI's.

Everything above the transport (the attempt loop, breakers, watchdogs, continuation, relay,
settlement) works on chat-completion answers and chat SSE events. A `Wire` is one call's
translation to and from a provider's own format: where the request goes and with which
headers, its whole answer as a chat completion, its stream as chat SSE events (fed raw bytes,
so a binary framing plugs in as well as SSE), and its errors as the one taxonomy. An
exchange given no Wire speaks the OpenAI wire with no translation at all: the fast path.

The transport knows no provider: adapters (providers/) make Wires; this module only says
what a Wire is."""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.sse import MAX_EVENT_BYTES, SseSplitter


class Decoder(Protocol):
    """Turns a provider's stream, as raw bytes in any chunking, into whole chat SSE events
    (each `data: {...}` without its blank-line terminator). It raises a Failure for an
    in-band error the provider sends mid-stream, once it has returned every event before
    that error (those are the client's)."""

    def feed(self, data: bytes) -> list[bytes]: ...

    def finish(self) -> list[bytes]:
        """The events still owed when the provider's stream ended."""
        ...


class Wire:
    """One call to a provider in its own format. The base speaks the OpenAI wire unchanged
    (an adapter overrides what differs), so a subclass states only its differences."""

    __slots__ = ("headers", "method", "own_auth", "target")

    stream_type: str = "text/event-stream"  # the content type of the provider's stream

    def __init__(
        self, target: str, headers: bytes = b"", *, own_auth: bool = True, method: str = "POST"
    ) -> None:
        self.method = method
        self.target = target  # path and query after the deployment's URL
        self.headers = headers  # extra header lines, each ending in CRLF (its credential)
        self.own_auth = own_auth  # True: the deployment's bearer line is left out

    def answer(self, data: bytes) -> tuple[bytes, dict[str, Any]]:
        """A whole 2xx answer as a chat completion: its bytes and its parsed payload (usage
        and model included). ValueError when the answer is not one the provider sends.
        The base reads an OpenAI answer as it is."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ValueError("not JSON") from None
        if not isinstance(payload, dict):
            raise ValueError("not an object")
        return data, payload

    def decoder(self, max_event_bytes: int = MAX_EVENT_BYTES) -> Decoder:
        """A fresh decoder for one stream, refusing an event past `max_event_bytes`; the
        base splits OpenAI's SSE."""
        return SseSplitter(max_event_bytes)

    def failure(
        self,
        status: int,
        body: bytes,
        headers: tuple[tuple[bytes, bytes], ...],
        retry_after: float | None,
        deployment: str,
    ) -> Failure:
        """A non-2xx answer as a classified Failure."""
        return failures.failure_for_status(status, body, headers, retry_after, deployment)

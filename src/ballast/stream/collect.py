"""A whole answer asked for as a stream, so the two stream clocks guard it too."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import orjson

from ballast.resilience import failures
from ballast.resilience.clock import Clock
from ballast.resilience.deadline import Watchdog
from ballast.resilience.failures import Failure
from ballast.stream.event import StreamEvent
from ballast.stream.exchange import UpstreamStream, is_stream, stream_of
from ballast.upstream.answer import Reply, answer_head, reply_of, too_large
from ballast.upstream.client import Upstream, UpstreamRequest
from ballast.upstream.http1 import HttpError, Response, TooLarge
from ballast.upstream.provider_wire import Wire

_UNGUARDED = nullcontext()


async def collect(
    upstream: Upstream,
    request: UpstreamRequest,
    clock: Clock,
    assemble: Callable[[list[StreamEvent]], dict[str, Any] | None],
) -> Reply:
    """A whole answer asked for as a stream (`body` asks for one), so the two stream clocks
    guard it: a silent or stalled upstream fails in seconds, not at the request deadline,
    and the attempt loop fails over before the client has waited long. `assemble` turns the
    events into the answer's object. An upstream that answers whole anyway (it ignored the
    request's `stream`) is read as `fetch` reads it, within the attempt's time."""
    now = clock.monotonic()
    path, wire, until = request.path, request.wire, request.until
    first = min(now + upstream.timeouts.first_token, until)
    response, watchdog = await answer_head(upstream, request, clock, first)
    if not is_stream(response, wire):
        return await _whole(
            response, watchdog, upstream, path, min(until, now + upstream.timeouts.answer), wire
        )
    stream = stream_of(upstream, request, response, clock, watchdog)
    try:
        events = await _read(stream, first, upstream.answer_limit(path))
    except TooLarge:
        raise too_large(upstream, path) from None
    finally:
        stream.close()
    assembled = assemble(events)
    if assembled is None:
        raise Failure(
            failures.BAD_RESPONSE, "a streamed answer that does not add up", deployment=upstream.id
        )
    return Reply(200, stream.headers, orjson.dumps(assembled), assembled)


async def _whole(
    response: Response,
    watchdog: Watchdog,
    upstream: Upstream,
    path: str,
    deadline: float,
    wire: Wire | None,
) -> Reply:
    """An answer that came whole though a stream was asked for, read by `deadline`."""
    try:
        # The stream's one timer guards the whole answer's read instead, unless the answer
        # came with its head (a short one, the usual case): reading it waits for nothing.
        with _UNGUARDED if response.complete else watchdog.until(deadline):
            data = await response.read(max_size=upstream.answer_limit(path))
    except TooLarge:
        raise too_large(upstream, path) from None
    except TimeoutError:
        raise Failure(
            failures.REQUEST_TIMEOUT, "no complete answer in time", deployment=upstream.id
        ) from None
    except HttpError:
        raise Failure(
            failures.RESET, "connection lost while reading the answer", deployment=upstream.id
        ) from None
    finally:
        watchdog.close()
        response.release()
    return reply_of(response, data, upstream, wire)


async def _read(stream: UpstreamStream, first: float, limit: int) -> list[StreamEvent]:
    """Every event of the stream, the first token by `first` (monotonic); TooLarge past
    `limit` bytes."""
    events: list[StreamEvent] = []
    size = 0
    state = stream.state
    while not (state.output or state.finished or stream.exhausted):
        events.extend(await stream.next_events(first))
    while not stream.exhausted:
        more = await stream.next_events()
        events.extend(more)
        size += sum([len(e.raw) for e in more])
        if size > limit:
            events.clear()
            raise TooLarge(f"a streamed answer past {limit} bytes")
    return events

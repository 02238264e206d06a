"""One attempt's stream from one deployment, guarded by two clocks (time to first token, gap
between chunks), its events typed as they are split and read once by the stream's state.
Every failure leaves here as a classified Failure. A whole answer is upstream/answer.py's; a
whole answer read as a stream is collect.py's.

It lives above the transport because its clocks read what the events mean: the first token
is the first event with model output, and a stream ends at `[DONE]` or a Responses terminal
event. The transport below it hands it raw bytes and a provider's decoder; it hands typed
events up."""

from __future__ import annotations

import math
from collections.abc import Callable

import orjson

from ballast.resilience import failures
from ballast.resilience.clock import Clock
from ballast.resilience.deadline import Watchdog
from ballast.resilience.failures import Failure
from ballast.stream.event import DONE_EVENT, NOT_JSON, StreamEvent, read
from ballast.stream.state import StreamState
from ballast.upstream.answer import answer_head
from ballast.upstream.client import Upstream, UpstreamRequest, relay_headers
from ballast.upstream.http1 import HttpError, Response
from ballast.upstream.provider_wire import Decoder, Wire
from ballast.upstream.sse import EventTooLarge, SseSplitter

# Buffered bytes of an event stream at which its socket stops being read. A stream's reader
# relays what it takes at once, so this (with one socket read) is what a stream whose client
# stopped reading holds on this side; a whole answer keeps the pool's larger mark.
STREAM_HIGH_WATER = 32 * 1024
# The length of a Messages delta's name line, `event: content_block_delta`: only an event
# with such a line may be a delta the state reads without a parse.
_DELTA_LINE = len(b"event: content_block_delta")


class UpstreamStream:
    """An open upstream stream. `next_events` yields relayable typed events and raises a
    Failure on a stall, a cut, a reset or an in-band error. A provider's `decoder` turns its
    own stream into chat events; the default splits SSE."""

    def __init__(
        self,
        upstream: Upstream,
        response: Response,
        clock: Clock,
        watchdog: Watchdog | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        self.upstream = upstream
        self.response = response
        response.high_water = min(response.high_water, STREAM_HIGH_WATER)
        self._watchdog = watchdog or Watchdog(clock)
        self.state = StreamState(limit=upstream.max_kept_chars)
        self._clock = clock
        self._splitter: Decoder = (
            SseSplitter(upstream.max_event_bytes) if decoder is None else decoder
        )
        self._inter_chunk = upstream.timeouts.inter_chunk
        self._closed = False
        self._eof = False
        self._failure: Failure | None = None
        self.until = math.inf  # monotonic: the attempt's deadline bounds the whole stream
        self._alive = False  # the last chunk completed an event (the upstream is alive)
        self._forward: Callable[[list[StreamEvent]], bool] | None = None  # while pumping
        self._pumped: list[StreamEvent] | BaseException | None = None  # why the pump stopped

    @property
    def exhausted(self) -> bool:
        return self._eof

    @property
    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The upstream's response headers a client may see."""
        return relay_headers(self.response)

    async def next_events(self, deadline: float | None = None) -> list[StreamEvent]:
        """Read until at least one data event is ready; [] once the stream has ended properly.
        The wait for it runs on one clock: the inter-chunk timeout, restarted by every event
        (a comment too: the upstream is alive), or `deadline` (the clock's monotonic time)
        when given, e.g. for the first token."""
        if self._failure is not None:  # an in-band error, after the events before it
            failure, self._failure = self._failure, None
            raise failure
        if self._eof:
            return []
        content = self.response
        fixed = deadline is not None
        out: list[StreamEvent] = []
        while not out:
            try:
                # Data already buffered needs no clock; waiting for more runs on one.
                chunk = content.read_nowait()
                if not chunk and not content.at_eof():
                    if deadline is None:
                        deadline = self._clock.monotonic() + self._inter_chunk
                    with self._watchdog.until(min(deadline, self.until)):
                        chunk = await content.readany()
            except TimeoutError:
                raise self._silent() from None
            except HttpError:
                raise self._cut() from None
            if not chunk:
                return self._finish(out)
            self._alive = False
            out = self._events_of(chunk)
            if self._alive and not fixed:
                deadline = None
            if self._failure is not None or self._eof:
                return out
        return out

    async def pump(self, forward: Callable[[list[StreamEvent]], bool]) -> list[StreamEvent]:
        """`next_events` for a relay that can write to its client at once: each chunk's
        events go to `forward` from the connection's callback as they arrive, so neither a
        task nor a coroutine runs per chunk; the inter-chunk clock moves with one clock read
        per chunk. Returns what `next_events` would for the rest: the events that end the
        stream (for the caller to relay as its last piece), or raises its Failure. Returns []
        early when `forward` said False (the client's buffer is full: drain it, then pump
        again); what arrives meanwhile waits, bounded, in the answer's buffer."""
        content = self.response
        if self._failure or self._eof or content.pending or content.complete or content.failed:
            return await self.next_events()  # what is there already is read as always
        self._forward = forward
        self._pumped = None
        content.consumer = self._on_chunk
        try:
            deadline = self._clock.monotonic() + self._inter_chunk
            with self._watchdog.until(min(deadline, self.until)):
                while self._pumped is None and not content.complete and not content.failed:
                    await content.wait()
        except TimeoutError:
            raise self._silent() from None
        finally:
            content.consumer = None
            self._forward = None
        pumped, self._pumped = self._pumped, None
        if isinstance(pumped, BaseException):
            raise pumped
        if pumped is not None and (pumped or not self._eof):
            return pumped
        return await self.next_events()  # the answer ended or broke: read what is left

    def _on_chunk(self, chunk: bytes) -> None:
        """One chunk of a pumped stream, in the connection's callback: nothing may raise
        into it, so what must stop the pump is handed to its task."""
        try:
            self._alive = False
            events = self._events_of(chunk)
            if self._alive:
                self._watchdog.extend(min(self._clock.monotonic() + self._inter_chunk, self.until))
            if self._eof:
                self._stop(events)  # the last piece: the task relays it
            elif events and not self._forward_now(events):
                self._stop([])
            elif self._failure is not None:
                self._stop([])
        except Exception as error:  # a Failure, or a fault of ours: the task's to raise
            self._stop(error)

    def _forward_now(self, events: list[StreamEvent]) -> bool:
        forward = self._forward
        return forward is not None and forward(events)

    def _stop(self, result: list[StreamEvent] | BaseException) -> None:
        self.response.consumer = None
        self._pumped = result
        self.response.wake()

    def _events_of(self, chunk: bytes) -> list[StreamEvent]:
        """The whole events of `chunk` a client may see (the rest waits in the splitter);
        `_alive` notes that an event, of any kind, completed. An in-band error raises if no
        event came before it; otherwise it waits in `_failure`, for the next read."""
        try:
            events = self._splitter.feed(chunk)
        except EventTooLarge:
            del chunk
            raise Failure(
                failures.BAD_RESPONSE,
                "the upstream sent an event larger than max_event_bytes"
                f" ({self.upstream.max_event_bytes} bytes)",
                deployment=self.upstream.id,
            ) from None
        except Failure as failure:  # a provider's in-band error
            failure.deployment = self.upstream.id
            raise
        out: list[StreamEvent] = []
        if events:
            self._alive = True
        for event in events:
            try:
                taken = self._take(event)
            except Failure as failure:
                if not out:
                    raise
                # What came before the error reaches the client first: the stream's
                # state already counts it as sent.
                self._failure = failure
                return out
            if taken is not None:
                out.append(taken)
            if self.state.done:
                self._eof = True
                return out
        return out

    def _silent(self) -> Failure:
        """The failure of a wait that ran out of time."""
        if self.until <= self._clock.monotonic():
            return Failure(
                failures.REQUEST_TIMEOUT,
                "the request's time ran out mid-stream",
                deployment=self.upstream.id,
            )
        return Failure(
            failures.INTER_CHUNK_TIMEOUT if self.state.output else failures.FIRST_TOKEN_TIMEOUT,
            "upstream went silent",
            deployment=self.upstream.id,
        )

    def _cut(self) -> Failure:
        return Failure(
            failures.STREAM_CUT,
            "upstream connection broke mid-stream",
            deployment=self.upstream.id,
        )

    def _take(self, event: bytes) -> StreamEvent | None:
        """One event, typed and read by the stream's state (the one parse of its data); None
        for an event that must not reach the client (a comment, a malformed chunk). Runs for
        every event of every stream: the usual one-line `data: {...}` (and the usual named
        `event: x` then `data: {...}` of a Messages stream) is parsed at once, and only what
        that parse refuses takes the careful path, line by line."""
        state = self.state
        taken = None
        if event.startswith(b"data:"):
            data = event[5:]  # JSON may keep its leading space
            if len(data) < 16 and data.strip() == b"[DONE]":
                state.done = True
                return StreamEvent(event + b"\n\n", data, NOT_JSON)
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                pass  # several lines, or not JSON: read below
            else:
                taken = StreamEvent(event + b"\n\n", data, payload)
        elif event.startswith(b"event:"):
            end = event.find(b"\n")
            if end > 0 and event.startswith(b"data:", end + 1):
                data = event[end + 6 :]
                if end == _DELTA_LINE and state.observe_plain_delta(data):
                    return StreamEvent(event + b"\n\n", data)  # its data parsed if asked
                try:
                    payload = orjson.loads(data)  # refuses a second data line: read below
                except orjson.JSONDecodeError:
                    pass
                else:
                    taken = StreamEvent(event + b"\n\n", data, payload)
        if taken is None:
            taken = read(event)
            payload = taken.json
            if payload is NOT_JSON:
                if taken.data is None:
                    return None
                if taken.done:
                    state.done = True
                    return taken
                state.malformed += 1
                return None
        if type(payload) is dict and "error" in payload and "choices" not in payload:
            raise Failure(
                failures.SERVER_ERROR,
                "upstream sent an error event mid-stream",
                body=(taken.data or b"").strip(),
                deployment=self.upstream.id,
            )
        state.observe(payload)
        return taken

    def _finish(self, out: list[StreamEvent]) -> list[StreamEvent]:
        self._eof = True
        try:
            rest = self._splitter.finish()
        except Failure as failure:
            failure.deployment = self.upstream.id
            raise
        for event in rest:
            taken = self._take(event)
            if taken is not None:
                out.append(taken)
        if self.state.done:
            return out
        if self.state.finished:
            # A complete answer without [DONE]: finish it for the client at once.
            self.state.done = True
            out.append(DONE_EVENT)
            return out
        cut = Failure(
            failures.STREAM_CUT,
            "upstream closed the stream before the answer finished",
            deployment=self.upstream.id,
        )
        if out:
            # The state has read these: the client gets them before the cut, so that a
            # continuation goes on from exactly what the client has.
            self._failure = cut
            return out
        raise cut

    def close(self) -> None:
        """Return the connection to the pool only after a clean end; otherwise drop it."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.close()
        if self.state.done and self._eof:
            self.response.release()
        else:
            self.response.close()


def stream_of(
    upstream: Upstream,
    request: UpstreamRequest,
    response: Response,
    clock: Clock,
    watchdog: Watchdog,
) -> UpstreamStream:
    """The stream of a 2xx answer to `request`: read in the provider's wire, bounded by the
    request's deadline, under the clock the answer's head was awaited on."""
    wire = request.wire
    decoder = None if wire is None else wire.decoder(upstream.max_event_bytes)
    stream = UpstreamStream(upstream, response, clock, watchdog, decoder)
    stream.until = request.until
    return stream


def is_stream(response: Response, wire: Wire | None) -> bool:
    """Whether the answer is an event stream in the wire's framing (its content type)."""
    return ("text/event-stream" if wire is None else wire.stream_type) in response.content_type


async def open_stream(
    upstream: Upstream, request: UpstreamRequest, clock: Clock
) -> tuple[UpstreamStream, list[StreamEvent]]:
    """Open a stream and wait for its first token (or its end) within `first_token`.
    Events before the first token (the role chunk) are held back and returned with it, so a
    silent upstream can still be replaced before the client has seen a byte. The request's
    `until` (monotonic) bounds the whole stream: the attempt's deadline."""
    until, wire = request.until, request.wire
    deadline = min(clock.monotonic() + upstream.timeouts.first_token, until)
    response, watchdog = await answer_head(upstream, request, clock, deadline)
    if not is_stream(response, wire):
        watchdog.close()
        response.close()
        raise Failure(
            failures.BAD_RESPONSE,
            f"expected an event stream, got {response.content_type or 'nothing'}",
            deployment=upstream.id,
        )
    stream = stream_of(upstream, request, response, clock, watchdog)
    held: list[StreamEvent] = []
    try:
        while True:
            events = await stream.next_events(deadline)
            held.extend(events)
            if stream.state.output or stream.state.finished or stream.exhausted:
                return stream, held
    except BaseException:
        stream.close()
        raise

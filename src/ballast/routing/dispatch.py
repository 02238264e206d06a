"""The two kinds of exchange, run through the one attempt loop: a whole answer, and a stream
opened on the first deployment that produces a first token (hedged when configured)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from ballast.config import ModelGroup
from ballast.providers.base import EditedCall, OutboundCall
from ballast.resilience.clock import Clock
from ballast.resilience.deadline import Deadline
from ballast.resilience.failures import Failure
from ballast.routing.attempt import Attempt
from ballast.routing.attempt_loop import AttemptLoop, Attempts, Exchange, Routable, first_success
from ballast.routing.targets import Target
from ballast.stream.assemble import assemble_payload
from ballast.stream.collect import collect
from ballast.stream.event import StreamEvent
from ballast.stream.exchange import UpstreamStream, open_stream
from ballast.upstream.answer import Reply, fetch
from ballast.upstream.client import Route, UpstreamRequest

T = TypeVar("T")


class Call(OutboundCall, Routable, Protocol):
    """A client request as dispatch needs it."""


def streamable(call: Call) -> bool:
    """A whole answer that can be asked for as a stream and put back together exactly:
    not one with log probabilities, `best_of` or `echo` (such a request goes as it came).
    A Responses stream ends with the whole Response, so it can be (not a background one,
    whose answer is the queued response itself)."""
    if call.path == "/responses":
        return not call.payload.get("background")
    if call.path != "/chat/completions" and call.path != "/completions":
        return False
    payload = call.payload
    return not (payload.get("logprobs") or payload.get("best_of") or payload.get("echo"))


def as_stream(call: Call) -> EditedCall:
    """A client request for a whole answer, as sent to ask the upstream for a stream of it
    (with the usage that the answer carries)."""
    if call.path == "/responses":  # its stream always ends with the usage
        return EditedCall(call, {**call.edits, "stream": True})
    return EditedCall(
        call, {**call.edits, "stream": True, "stream_options": {"include_usage": True}}
    )


def request_for(
    attempt: Attempt,
    call: OutboundCall,
    model: str,
    stream: bool,
    prefill: str | None = None,
    until: float | None = None,
    headers: bytes = b"",
) -> UpstreamRequest:
    """The one place a call becomes what a deployment is sent: its adapter's body (every
    edit applied once) and wire, bounded by the attempt's deadline unless `until` is sooner;
    `headers`, more header lines (the attempt's trace context)."""
    adapter = attempt.target.adapter
    bridge = call.bridge
    while bridge is not None and not adapter.takes(call):
        # A group mixing ways (native and bridged Messages; providers that carry an
        # extended chat form and some that do not): this deployment takes another form.
        call, bridge = bridge, bridge.bridge
    body = adapter.body(call, model, prefill)
    return UpstreamRequest(
        call.path,
        body,
        adapter.wire(call, model, body, stream, prefill),
        call.request_id,
        None,
        attempt.deadline if until is None else until,
        headers,
    )


@dataclass(slots=True)
class OpenStream:
    """A stream past its first token, with the attempt that holds its verdict."""

    attempt: Attempt
    stream: UpstreamStream
    held: list[StreamEvent]  # events read so far, not yet relayed

    def abandon(self) -> None:
        self.stream.close()
        self.attempt.abandoned()


class Dispatch:
    def __init__(
        self,
        loop: AttemptLoop,
        clock: Clock,
        answers_as_streams: bool = False,
        whole_answer_share: float = 1.0,
    ) -> None:
        self.loop = loop
        self.clock = clock
        self.answers_as_streams = answers_as_streams
        self.whole_answer_share = whole_answer_share

    def _as_stream(self, target: Target) -> bool:
        own = target.adapter.deployment.answers_as_streams
        return self.answers_as_streams if own is None else own

    def _trace(self) -> bytes:
        """The current attempt's trace context for the upstream (nothing when tracing is
        off: the request path pays one `is None`)."""
        tracer = self.loop.tracer
        return b"" if tracer is None else tracer.outgoing()

    def _whole_answer_deadline(self, attempt: Attempt, attempts: Attempts) -> float:
        """A whole answer no stream clock guards may use only its share of the time left,
        so that a silent deployment still leaves time for the next one."""
        now = self.clock.monotonic()
        return min(attempt.deadline, now + (attempts.deadline - now) * self.whole_answer_share)

    def _routed(
        self,
        attempt: Attempt,
        attempts: Attempts,
        call: Call,
        model: str,
        request: UpstreamRequest,
        send: Callable[[UpstreamRequest], Awaitable[T]],
    ) -> Awaitable[T]:
        """`send` the request along the route the deployment's adapter gives it. A handle
        heal's second try is an attempt of its own in the request's count."""
        adapter = attempt.target.adapter
        if adapter.handles is None:  # the usual case: no route to find first
            return send(request)
        tries = 0

        def counted(route: Route | None) -> Awaitable[T]:
            nonlocal tries
            tries += 1
            if tries > 1:
                attempts.count += 1
            return send(request.routed(route))

        return adapter.routed(call, model, counted)

    def complete(self, call: Call, group: ModelGroup, attempts: Attempts) -> Awaitable[Reply]:
        """A whole answer from the first deployment that gives one. It is asked for as a
        stream where it can be (`routing.answers_as_streams`), so a silent or stalled
        deployment is found out by the stream clocks and replaced, not waited for."""
        can_stream = streamable(call)
        others = len(group.deployments) > 1 or bool(group.fallbacks) or bool(call.fallbacks)
        clock = self.clock

        def exchange(attempt: Attempt, model: str) -> Awaitable[Reply]:
            target = attempt.target
            upstream = target.upstream
            trace = self._trace()
            if can_stream and self._as_stream(target):
                streamed = request_for(attempt, as_stream(call), model, True, None, None, trace)

                def collected(request: UpstreamRequest) -> Awaitable[Reply]:
                    return collect(upstream, request, clock, partial(assemble_payload, call.path))

                return self._routed(attempt, attempts, call, model, streamed, collected)
            until = self._whole_answer_deadline(attempt, attempts) if others else None
            request = request_for(attempt, call, model, False, None, until, trace)
            return self._routed(
                attempt, attempts, call, model, request, lambda r: fetch(upstream, r, clock)
            )

        return self.loop.run(call, group, attempts, exchange)

    async def open(
        self,
        call: Call,
        group: ModelGroup,
        attempts: Attempts,
        prefill: str | None = None,
    ) -> OpenStream:
        """A stream on the first deployment that produces a first token; `prefill` is the
        text a continuation must go on from."""

        def open_on(attempt: Attempt, model: str) -> Awaitable[OpenStream]:
            return self._open_on(attempt, attempts, call, model, prefill)

        async def exchange(attempt: Attempt, model: str) -> OpenStream:
            delay = self.loop.hedge_delay(attempt.target)
            if delay is None:
                return await open_on(attempt, model)
            return await self._hedged(attempt, attempts, model, delay, open_on)

        return await self.loop.run(call, group, attempts, exchange)

    async def _open_on(
        self, attempt: Attempt, attempts: Attempts, call: Call, model: str, prefill: str | None
    ) -> OpenStream:
        upstream, clock = attempt.target.upstream, self.clock
        request = request_for(attempt, call, model, True, prefill, None, self._trace())
        stream, held = await self._routed(
            attempt, attempts, call, model, request, lambda r: open_stream(upstream, r, clock)
        )
        attempt.first_token()
        return OpenStream(attempt, stream, held)

    async def _hedged(
        self,
        attempt: Attempt,
        attempts: Attempts,
        model: str,
        delay: float,
        open_on: Exchange[OpenStream],
    ) -> OpenStream:
        """No first token after `delay`: ask a second deployment too, as one more attempt of
        the request; the first to produce a token wins and the other is abandoned."""
        primary = asyncio.ensure_future(open_on(attempt, model))
        clock = self.clock
        with contextlib.suppress(TimeoutError), Deadline(clock, clock.monotonic() + delay):
            await asyncio.wait({primary})
        if primary.done():
            return primary.result()
        backup = self.loop.hedge_target(attempt.target, attempts)
        if backup is None:
            return await primary
        target, permit = backup
        self.loop.on_event("hedge", {"deployment": target.id, "after": attempt.target.id})
        second = asyncio.ensure_future(self.loop.attempt(target, permit, model, attempts, open_on))
        winner = await first_success(primary, second, OpenStream.abandon)
        if winner.attempt is not attempt:
            # The loop ends the attempt it started only when this exchange fails: here the
            # backup answered, so the primary's verdict is given now.
            error = None if primary.cancelled() else primary.exception()
            if isinstance(error, Failure):
                error.deployment = attempt.id
                attempts.failures.append(error)
                attempt.failed(error)
            else:
                attempt.abandoned()
        return winner

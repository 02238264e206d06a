"""A stream on its way to the client. Before the first byte the attempt loop fails over
silently; after it, a stall or a cut is healed by continuation: the next deployment is asked
to go on with the same answer (the partial text as an assistant prefill where the provider
continues one, or a regeneration that must begin with what the client already has), and only
the remainder is relayed. When nothing can continue, the stream ends with an error event
naming the fault, made once in the client's shape (Responder.fail). Each stream's attempt
gets its verdict when that stream ends. The relay carries typed events of any shape: it
reads only what the exchange's state and the splice read, and reshapes nothing itself."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ballast.config import ModelGroup
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.pipeline.respond import Responder
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.routing.attempt_loop import Attempts
from ballast.routing.dispatch import Dispatch, OpenStream
from ballast.stream.event import StreamEvent
from ballast.stream.splice import Diverged, Sent, Splice

log = logging.getLogger("ballast.relay")

# What the relay yields: whole events for the client, or the error that ends the stream.
Piece = list[StreamEvent] | ApiError


def failure_error(failure: Failure, detail: str) -> ApiError:
    """The error that ends a stream broken past healing."""
    kind = failure.kind
    message = f"The upstream stream failed ({kind.label}): {detail}"
    return ApiError(kind.status, message, kind.error_type, kind.code)


def at_least(usage: dict[str, Any], relayed: int) -> dict[str, Any] | None:
    """`usage` with its output tokens (chat's `completion_tokens`, or the `output_tokens`
    of Messages and Responses) raised to `relayed`; None when they are that many already."""
    for name in ("completion_tokens", "output_tokens"):
        count = usage.get(name)
        if type(count) is int:
            if count >= relayed:
                return None
            raised = {**usage, name: relayed}
            total = usage.get("total_tokens")
            if type(total) is int:
                raised["total_tokens"] = total + relayed - count
            return raised
    return None


class Relay:
    def __init__(
        self,
        dispatch: Dispatch,
        call: RequestContext,
        group: ModelGroup,
        opened: OpenStream,
        attempts: Attempts,
        continuation: bool = True,
    ) -> None:
        self.dispatch = dispatch
        self.call = call
        self.group = group
        self.opened = opened
        self.first = opened
        self.attempts = attempts
        self.continuation = continuation
        self.continuations = 0
        self._splice: Splice | None = None
        self._diverged = False  # a continuation said something other than the client has
        self._original: Failure | None = None
        # True while the piece just yielded is the stream's last: it may end the response.
        self.ending = False
        # Set by the pipeline for the fast path: once a first piece went out, the rest is
        # forwarded by the client's writer as it arrives (UpstreamStream.pump), while it
        # `forwards` (nothing keeps the events; a shape's translator may reshape them).
        self.client: Responder | None = None
        self._yielded = False

    @property
    def deployment(self) -> str:
        return self.opened.attempt.id

    @property
    def model(self) -> str:
        """The model that answered, as the deployment knows it (for pricing)."""
        return self.opened.attempt.target.adapter.upstream_model(self.call.model)

    @property
    def usage(self) -> object:
        return self.opened.stream.state.usage

    def cut_usage(self, usage: dict[str, Any]) -> dict[str, Any] | None:
        """The upstream's usage of a stream cut before it finished, with its output count
        raised to what was relayed when that is more (Anthropic's count comes with the
        first event and is final only at the end); None when it needs no raising."""
        state = self.opened.stream.state
        if state.finished:
            return None
        return at_least(usage, state.relayed_tokens)

    def relayed_usage(self, prompt: int) -> dict[str, int]:
        """What a stream cut short without the upstream's usage has cost, estimated: the
        prompt's `prompt` tokens and the output tokens its streams carried (the first one
        and the continuation that replaced it, each of which an upstream bills)."""
        first, last = self.first.stream.state, self.opened.stream.state
        completion = first.relayed_tokens + (0 if last is first else last.relayed_tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def events(self) -> AsyncIterator[Piece]:
        """The client's pieces: whole events, and last, when nothing could heal the stream,
        the error that ends it."""
        try:
            pending = self.opened.held
            self.opened.held = []
            while True:
                stream = self.opened.stream
                if pending:
                    try:
                        out = self._filter(pending)
                    except Diverged:
                        self._end(None, diverged=True)
                        self._diverged = True
                        original = self._original or Failure(failures.STREAM_CUT, "diverged")
                        self.ending = True
                        yield failure_error(original, self._detail(original))
                        return
                    if out:
                        self.ending = stream.state.done
                        self._yielded = True
                        yield out
                if stream.state.done:
                    self._end(None)
                    return
                try:
                    client = self.client
                    if client is not None and self._yielded and self._splice is None:
                        await client.drain()
                        if client.forwards:
                            pending = await stream.pump(client.forward)
                            continue
                    pending = await stream.next_events()
                except Failure as failure:
                    self._end(failure)
                    self._original = self._original or failure
                    recovered = await self._continue(failure)
                    if recovered is None:
                        self.ending = True
                        yield failure_error(self._original, self._detail(self._original))
                        return
                    pending = recovered
        finally:
            self.close()

    def _filter(self, events: list[StreamEvent]) -> list[StreamEvent]:
        if self._splice is None:
            return events
        return self._splice.apply_all(events)

    def _detail(self, failure: Failure) -> str:
        if self._diverged:
            return "the continuation diverged from the answer"
        if failure.kind is failures.INTER_CHUNK_TIMEOUT:
            return "no data within the inter-chunk timeout and no deployment could continue"
        if failure.kind is failures.REQUEST_TIMEOUT:
            return "the request's time ran out before the answer finished"
        if failure.kind is failures.STREAM_CUT:
            return (
                "the connection ended before the answer finished and no deployment could continue"
            )
        return "the upstream ended the stream with an error and no deployment could continue"

    def _sent(self) -> Sent:
        """What the client has now: what the first stream said, or what the continuation's
        splice let through after what the client had before it."""
        state = self.opened.stream.state
        splice = self._splice
        return Sent.of(state) if splice is None else splice.sent(state)

    async def _continue(self, failure: Failure) -> list[StreamEvent] | None:
        """Open a continuation on another deployment; its first events, or None."""
        call = self.call
        if not self.continuation or call.path in ("/embeddings", "/responses", "/messages"):
            return None
        if call.payload.get("n", 1) not in (1, None) or self.opened.stream.state.untracked:
            return None  # several choices, or output no continuation can be checked against
        sent = self._sent()
        self.attempts.excluded.add(self.deployment)
        self.dispatch.loop.on_event(
            "continuation", {"deployment": self.deployment, "reason": failure.kind.label}
        )
        # Only text can be prefilled; reasoning and tool calls are regenerated and checked.
        prefill = sent.prefill
        try:
            opened = await self.dispatch.open(call, self.group, self.attempts, prefill=prefill)
        except Failure as second:
            log.warning("no continuation for %s: %s", self.deployment, second.kind.label)
            return None
        except Exception:
            # A request or answer shape nothing here expected: the stream still ends with
            # its error event, never with an exception out of the relay.
            log.exception("continuation of a stream from %s failed", self.deployment)
            return None
        self.opened = opened
        self.continuations += 1
        # The deployment that answered says whether it went on from the prefill (a model or
        # mode that refuses one was sent none, and regenerates).
        adapter = opened.attempt.target.adapter
        regenerate = prefill is None or not adapter.continues(call, prefill)
        held = opened.held
        opened.held = []
        try:
            Splice(sent, regenerate).apply_all(held)  # check it agrees before relaying
        except Diverged:
            self._end(None, diverged=True)
            self._diverged = True
            return None
        self._splice = Splice(sent, regenerate)
        return held

    def _end(self, failure: Failure | None, diverged: bool = False) -> None:
        """The current stream's verdict: it finished, or broke with `failure`. A diverged
        continuation answered, but not the answer the client has: it gets no verdict and
        hands its breaker permit back."""
        opened = self.opened
        if diverged:
            opened.attempt.abandoned()
        elif failure is None:
            opened.attempt.succeeded()
        else:
            failures.drop_references(failure)
            self.attempts.failures.append(failure)
            opened.attempt.failed(failure)
        opened.stream.close()

    def close(self) -> None:
        """Called on every exit: a stream abandoned by the client drops its connection."""
        self.opened.abandon()

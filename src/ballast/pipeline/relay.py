"""A stream on its way to the client. Before the first byte the attempt loop fails over
silently; after it, a stall or a cut is healed by continuation: the next deployment is asked
to go on with the same answer (the partial text as an assistant prefill where the provider
continues one, or a regeneration that must begin with what the client already has), and only
the remainder is relayed. When nothing can continue, the stream ends with an error event
naming the fault. Each stream's attempt gets its verdict when that stream ends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson

from ballast.config import ModelGroup
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import error_event
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.routing.attempts import Attempts
from ballast.routing.dispatch import Dispatch, OpenStream
from ballast.upstream.sse import event_data

log = logging.getLogger("ballast.relay")


def failure_event(failure: Failure, detail: str) -> bytes:
    kind = failure.kind
    return error_event(
        f"The upstream stream failed ({kind.label}): {detail}", kind.error_type, kind.code
    )


class _Diverged(Exception):
    pass


class _Splice:
    """Filters a continuation stream: drops its role chunk, and in regeneration mode drops
    text the client already has (and notices when the new answer says something else)."""

    def __init__(self, already_sent: str, regenerate: bool) -> None:
        self.expect = already_sent if regenerate else ""
        self.matched = 0

    def apply(self, event: bytes) -> bytes | None:
        data = event_data(event.rstrip(b"\n"))
        if data is None:
            return event
        if data == b"[DONE]":
            if self.matched < len(self.expect):
                raise _Diverged  # the new answer ended before reaching the client's text
            return event
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise _Diverged from None
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return event
        choice = choices[0]
        delta = choice.get("delta")
        key, holder = ("content", delta) if isinstance(delta, dict) else ("text", choice)
        piece = holder.get(key) or ""
        if not isinstance(piece, str):
            raise _Diverged  # not text: nothing the client has can be matched against it
        rewrite = False
        if isinstance(delta, dict) and "role" in delta:
            del delta["role"]
            rewrite = True
        remaining = len(self.expect) - self.matched
        if remaining > 0 and piece:
            head = piece[:remaining]
            if head != self.expect[self.matched : self.matched + len(head)]:
                raise _Diverged
            self.matched += len(head)
            piece = piece[len(head) :]
            holder[key] = piece
            rewrite = True
        if choice.get("finish_reason") and self.matched < len(self.expect):
            raise _Diverged  # a shorter answer: it never got to what the client has
        if rewrite:
            if not piece and not choice.get("finish_reason") and not payload.get("usage"):
                return None
            return b"data: " + orjson.dumps(payload) + b"\n\n"
        return event


def _is_usage_only(event: bytes) -> bool:
    """The final usage chunk (`choices: []` with `usage`), which clients get only on request."""
    if b'"usage"' not in event or b'"choices"' not in event:
        return False
    data = event_data(event.rstrip(b"\n"))
    if data is None or data == b"[DONE]":
        return False
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and payload.get("choices") == [] and "usage" in payload


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
        self._splice: _Splice | None = None
        # Usage was asked of the upstream for accounting, not by the client: keep it from them.
        self.strip_usage = False
        self._client_text = ""  # text relayed before the current stream began
        self._original: Failure | None = None
        # True while the piece just yielded is the stream's last: it may end the response.
        self.ending = False

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

    async def events(self) -> AsyncIterator[bytes]:
        """Wire bytes for the client, each piece made of whole SSE events."""
        try:
            pending = self.opened.held
            self.opened.held = []
            while True:
                stream = self.opened.stream
                if pending:
                    try:
                        out = self._filter(pending)
                    except _Diverged:
                        self._end(None)
                        original = self._original or Failure(failures.STREAM_CUT, "diverged")
                        self.ending = True
                        yield failure_event(original, "the continuation diverged from the answer")
                        return
                    if out:
                        self.ending = stream.state.done
                        yield out
                if stream.state.done:
                    self._end(None)
                    return
                try:
                    pending = await stream.next_events()
                except Failure as failure:
                    self._end(failure)
                    self._original = self._original or failure
                    recovered = await self._continue(failure)
                    if recovered is None:
                        self.ending = True
                        yield failure_event(self._original, self._detail(self._original))
                        return
                    pending = recovered
        finally:
            self.close()

    def _filter(self, events: list[bytes]) -> bytes:
        if self.strip_usage:
            events = [e for e in events if not _is_usage_only(e)]
        if self._splice is None:
            return b"".join(events)
        out = []
        for event in events:
            kept = self._splice.apply(event)
            if kept is not None:
                out.append(kept)
        return b"".join(out)

    def _detail(self, failure: Failure) -> str:
        if failure.kind is failures.INTER_CHUNK_TIMEOUT:
            return "no data within the inter-chunk timeout and no deployment could continue"
        if failure.kind is failures.REQUEST_TIMEOUT:
            return "the request's time ran out before the answer finished"
        return "the connection ended before the answer finished and no deployment could continue"

    def _sent_text(self) -> str:
        if self._splice is not None and self._splice.expect:
            return self.opened.stream.state.content
        return self._client_text + self.opened.stream.state.content

    async def _continue(self, failure: Failure) -> list[bytes] | None:
        """Open a continuation on another deployment; its first events, or None."""
        call = self.call
        if not self.continuation or call.path == "/embeddings":
            return None
        if call.payload.get("n", 1) not in (1, None):
            return None
        sent = self._sent_text()
        self.attempts.excluded.add(self.deployment)
        self.dispatch.loop.on_event(
            "continuation", {"deployment": self.deployment, "reason": failure.kind.label}
        )
        try:
            opened = await self.dispatch.open(call, self.group, self.attempts, prefill=sent)
        except Failure as second:
            log.warning("no continuation for %s: %s", self.deployment, second.kind.label)
            return None
        self.opened = opened
        self.continuations += 1
        self._client_text = sent
        regenerate = not opened.attempt.target.adapter.continues(call)
        held = opened.held
        opened.held = []
        self._splice = _Splice(sent, regenerate)
        try:
            self._filter(list(held))  # check it agrees before relaying anything
        except _Diverged:
            self._end(None, diverged=True)
            return None
        self._splice = _Splice(sent, regenerate)
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
            self.attempts.failures.append(failure)
            opened.attempt.failed(failure)
        opened.stream.close()

    def close(self) -> None:
        """Called on every exit: a stream abandoned by the client drops its connection."""
        self.opened.abandon()

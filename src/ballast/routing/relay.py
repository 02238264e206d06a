"""A stream on its way to the client. Before the first byte the router fails over silently;
after it, a stall or a cut is healed by continuation: the next deployment is asked to go on
with the same answer (the partial text as an assistant prefill where declared supported, or a
regeneration that must begin with what the client already has), and only the remainder is
relayed. When nothing can continue, the stream ends with an error event naming the fault."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.routing.router import Attempted, ProxyRequest, Router, Target
from ballast.upstream.exchange import UpstreamStream
from ballast.upstream.sse import event_data

log = logging.getLogger("ballast.relay")


def error_event(failure: Failure, detail: str) -> bytes:
    kind = failure.kind
    body = {
        "error": {
            "message": f"The upstream stream failed ({kind.label}): {detail}",
            "type": kind.error_type,
            "param": None,
            "code": kind.code,
        }
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


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
        payload = orjson.loads(data)
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices or not isinstance(choices[0], dict):
            return event
        choice = choices[0]
        delta = choice.get("delta")
        key, holder = ("content", delta) if isinstance(delta, dict) else ("text", choice)
        piece = holder.get(key) or ""
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


class _Diverged(Exception):
    pass


class Relay:
    def __init__(
        self,
        router: Router,
        request: ProxyRequest,
        group: Any,
        target: Target,
        stream: UpstreamStream,
        held: list[bytes],
        attempted: Attempted,
    ) -> None:
        self.router = router
        self.request = request
        self.group = group
        self.target = target
        self.stream = stream
        self._opened = stream
        self.attempted = attempted
        self.continuations = 0
        self._held = held
        self._splice: _Splice | None = None
        # Usage was asked of the upstream for accounting, not by the client: keep it from them.
        self.strip_usage = False
        self._client_text = ""  # text relayed before the current stream began
        self._live = True  # the current attempt still counts as in flight
        self._original: Failure | None = None
        # True while the piece just yielded is the stream's last: it may end the response.
        self.ending = False

    @property
    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The first upstream's response headers a client may see."""
        return self._opened.headers

    @property
    def deployment(self) -> str:
        return self.target.id

    @property
    def model(self) -> str:
        """The model that answered, as the deployment knows it (for pricing)."""
        upstream = self.target.deployment.model
        return upstream if upstream and upstream != "*" else self.request.model

    async def events(self) -> AsyncIterator[bytes]:
        """Wire bytes for the client, each piece made of whole SSE events."""
        try:
            pending = self._held
            self._held = []
            while True:
                if pending:
                    try:
                        out = self._filter(pending)
                    except _Diverged:
                        self._end(ok=False)
                        original = self._original or Failure(failures.STREAM_CUT, "diverged")
                        self.ending = True
                        yield error_event(original, "the continuation diverged from the answer")
                        return
                    if out:
                        self.ending = self.stream.state.done
                        yield out
                if self.stream.state.done:
                    self._end(ok=True)
                    return
                try:
                    pending = await self.stream.next_events()
                except Failure as failure:
                    self._end(ok=False, failure=failure)
                    self._original = self._original or failure
                    recovered = await self._continue(failure)
                    if recovered is None:
                        self.ending = True
                        yield error_event(self._original, self._detail(self._original))
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
        return "the connection ended before the answer finished and no deployment could continue"

    def _sent_text(self) -> str:
        if self._splice is not None and self._splice.expect:
            return self.stream.state.content
        return self._client_text + self.stream.state.content

    async def _continue(self, failure: Failure) -> list[bytes] | None:
        """Open a continuation on another deployment; its first events, or None."""
        request = self.request
        if not self.router.settings.routing.continuation or request.path == "/embeddings":
            return None
        if request.payload.get("n", 1) not in (1, None):
            return None
        sent = self._sent_text()
        self.attempted.excluded.add(self.target.id)
        self.router.on_event(
            "continuation", {"deployment": self.target.id, "reason": failure.kind.label}
        )
        prefill_ok = {t.id for t in self.router.targets.values() if t.deployment.supports_prefill}
        try:
            target, stream, held, _ = await self.router.open(
                request,
                self.group,
                state=self.attempted,
                body_for=lambda t, model: continuation_body(
                    request, t, model, sent, t.id in prefill_ok
                ),
            )
        except Failure as second:
            log.warning("no continuation for %s: %s", self.target.id, second.kind.label)
            return None
        prefilled = target.id in prefill_ok or (
            request.path == "/completions" and isinstance(request.payload.get("prompt"), str)
        )
        self.target, self.stream = target, stream
        self._live = True
        self.continuations += 1
        self._client_text = sent
        self._splice = _Splice(sent, regenerate=not prefilled)
        try:
            self._filter(list(held))  # check it agrees before relaying anything
        except _Diverged:
            self._end(ok=False)
            return None
        self._splice = _Splice(sent, regenerate=not prefilled)
        return held

    def _end(self, ok: bool, failure: Failure | None = None) -> None:
        if not self._live:
            return
        self._live = False
        stream = self.stream
        health = self.target.health
        if ok:
            now = self.router.clock.monotonic()
            health.finish(True, latency=now - stream.started, ttft=stream.ttft)
        else:
            health.finish(False)
            permit = self.target.breaker.acquire()
            if permit is not None and failure is not None:
                self.target.breaker.record_failure(permit)
        stream.close()

    def close(self) -> None:
        """Called on every exit: a stream abandoned by the client drops its connection."""
        if self._live:
            self._live = False
            self.target.health.abandon()
        self.stream.close()


def continuation_body(
    request: ProxyRequest, target: Target, model: str, sent: str, prefill: bool
) -> bytes:
    """The original request, asking the deployment to go on from `sent`."""
    upstream_model = target.deployment.model
    if upstream_model is None or upstream_model == "*":
        upstream_model = model
    payload = {**request.payload, "model": upstream_model}
    if request.path == "/completions" and isinstance(payload.get("prompt"), str):
        payload["prompt"] = payload["prompt"] + sent
    elif prefill and sent:
        messages = list(payload.get("messages") or [])
        messages.append({"role": "assistant", "content": sent})
        payload["messages"] = messages
        if target.deployment.provider in ("vllm", "sglang"):
            payload["continue_final_message"] = True
            payload["add_generation_prompt"] = False
    return orjson.dumps(payload)

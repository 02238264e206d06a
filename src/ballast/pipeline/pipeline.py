"""The request pipeline. Its order is written here once:

1. parse    the inbound shape turns the client's body into a RequestContext (api/), in
            chat-completion terms; its answer, stream and errors go back through the same
            shape (shape.py), so nothing below knows which API the client spoke;
2. resolve  the model names a model group, or 404;
3. admit    keys, model allowlist, budget and rate limits (access.py), when keys are in use;
4. cache    an answer kept for an identical request is served without going upstream;
5. dispatch the attempt loop finds a deployment that answers (routing/);
6. relay    a whole answer is sent, or a stream relayed with continuation (relay.py);
7. settle   usage and spend are recorded, the parallel slot freed: exactly once.

One Responder knows whether the response started, so every error takes the one form that
still fits; one allowlist decides which upstream headers the client sees."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import TYPE_CHECKING, Any

from ballast.cache.replay import is_complete
from ballast.config import ModelGroup, Settings
from ballast.pipeline.access import token_counts
from ballast.pipeline.asgi import (
    EVENT_STREAM,
    JSON,
    NO_CACHE,
    WRITE_TIMED_OUT,
    ClientGone,
    DisconnectWatch,
    header,
    read_body,
    require_json,
)
from ballast.pipeline.caching import HEADER as CACHE_HEADER
from ballast.pipeline.caching import (
    StreamRecorder,
    mode_of,
    scope_of,
    send_hit,
    settle_hit,
    take_field,
    wants_usage,
)
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError, from_failure, model_not_found
from ballast.pipeline.keepalive import KeepAlive
from ballast.pipeline.relay import Relay
from ballast.pipeline.respond import HeaderAllowlist, Responder
from ballast.pipeline.shape import Shape, TranslatedSend
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.failures import Action, Failure
from ballast.routing.attempt_loop import Attempts
from ballast.routing.dispatch import OpenStream
from ballast.routing.router import Router
from ballast.types import BODY_WRITER, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ballast.cache.service import ResponseCache
    from ballast.pipeline.access import Access

log = logging.getLogger("ballast.api")


def finish_reason(payload: dict[str, Any]) -> str | None:
    """The first choice's finish reason of a whole answer (traces record it)."""
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    return None


_ID_PREFIX = os.urandom(4).hex()
_ids = itertools.count(1)


def request_id(scope: Scope) -> bytes:
    given = header(scope, b"x-request-id")
    if given and len(given) <= 128:
        return given
    return f"{_ID_PREFIX}-{next(_ids)}".encode()


def is_passthrough(failure: Failure) -> bool:
    """An upstream's own refusal of the request itself: the client sees it unchanged."""
    return failure.status is not None and failure.kind.action in (
        Action.RETURN,
        Action.CONTEXT_FALLBACK,
    )


class Pipeline:
    def __init__(self, settings: Settings, router: Router, clock: Clock = SYSTEM_CLOCK) -> None:
        self.router = router
        self.clock = clock  # the body's and the disconnect watch's timers
        self.max_body_bytes = settings.server.max_body_bytes
        self.body_timeout = settings.server.body_timeout
        self.continuation = settings.routing.continuation
        self.keepalive = settings.routing.stream_keepalive
        self.headers_at_once = settings.routing.stream_headers_at_once
        self.expose = HeaderAllowlist(settings.upstream.expose_headers)
        self.access: Access | None = None  # set once state is ready at start-up
        self.cache: ResponseCache | None = None  # likewise; used by groups with `cache`

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, path: str, shape: Shape
    ) -> None:
        rid = request_id(scope)
        responder = Responder(send, [(b"x-request-id", rid)], shape, scope.get(BODY_WRITER))
        watch: DisconnectWatch | None = None
        ctx: RequestContext | None = None
        try:
            require_json(scope)
            body = await read_body(
                scope, receive, self.max_body_bytes, self.body_timeout, self.clock
            )
            ctx = shape.parse(path, body)  # 1
            ctx.request_id = rid.decode("latin-1")
            ctx.shape = shape.name
            ctx.authorization = shape.authorization(scope)
            scope["ballast.request"] = ctx  # read by the request log and metrics
            group = self._resolve(ctx)  # 2
            cache_field = take_field(ctx) if "cache" in ctx.payload else None
            if self.access is not None:
                await self._admit(scope, ctx, responder)  # 3
            watch = DisconnectWatch(receive, self.clock)
            if group.cache is not None and self.cache is not None:  # 4
                if await self._cached(scope, ctx, group, cache_field, responder, watch):
                    return
            if ctx.stream:  # 5, 6
                await self._stream(ctx, group, responder, watch)
            else:
                await self._complete(ctx, group, responder, watch)
        except ApiError as error:
            if watch is not None:
                watch.stop()
            await responder.error(error)
        except Failure as failure:
            if watch is not None:
                watch.stop()
            await self._failed(failure, responder)
        except ClientGone:
            scope["ballast.client_gone"] = True
            return
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            scope["ballast.client_gone"] = True  # the request log's outcome
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self._client_gone(ctx, rid, bool(scope.get(WRITE_TIMED_OUT)))
        finally:
            if ctx is not None:
                if not ctx.settled:
                    self._settle(ctx, "", None, None)  # 7: frees the slot if nothing did yet
                if ctx.lookup is not None:
                    ctx.lookup.done()  # identical requests waiting on this one go on
                if ctx.attempts is not None:
                    ctx.attempts.end()

    def _client_gone(self, ctx: RequestContext | None, rid: bytes, stopped_reading: bool) -> None:
        """The client went away, or stopped reading for `client_write_timeout` (the server
        then aborted its connection): its upstream request was dropped."""
        reason = "write_timeout" if stopped_reading else "disconnect"
        attempts = ctx.attempts if ctx is not None else None
        deployment = attempts.deployment if attempts is not None else None
        fields = {"deployment": deployment or "none", "reason": reason}
        self.router.loop.on_event("client_gone", fields)
        log.info("client gone (%s); upstream request %s dropped", reason, rid.decode("latin-1"))

    # -- the stages ------------------------------------------------------------------

    def _resolve(self, ctx: RequestContext) -> ModelGroup:
        group = self.router.resolve(ctx.model)
        if group is None:
            raise model_not_found(ctx.model)
        ctx.group = group
        return group

    async def _admit(self, scope: Scope, ctx: RequestContext, responder: Responder) -> None:
        assert self.access is not None
        ticket = await self.access.admit(scope, ctx)
        if ticket is None:
            return
        ctx.ticket = ticket
        if ticket.lease is not None:
            responder.extra.extend(ticket.lease.headers)
        if ctx.stream:
            ctx.ask_for_usage()

    async def _cached(
        self,
        scope: Scope,
        ctx: RequestContext,
        group: ModelGroup,
        cache_field: Any,
        responder: Responder,
        watch: DisconnectWatch,
    ) -> bool:
        """True when the answer came from the cache."""
        assert group.cache is not None and self.cache is not None
        ctx.lookup = lookup = await self.cache.lookup(
            ctx.path,
            group.name,
            ctx.payload,
            scope_of(ctx.ticket, ctx),
            group.cache,
            mode_of(scope, cache_field),
        )
        responder.extra.append((CACHE_HEADER, lookup.status))
        if lookup.body is None:
            return False
        watch.stop()
        ctx.settled = True  # a hit is settled as one, below
        settle_hit(self.access, ctx.ticket, lookup)
        usage = wants_usage(ctx, ctx.usage_added)
        await send_hit(responder.send, ctx, lookup, responder.extra, usage, responder.shape)
        return True

    async def _complete(
        self, ctx: RequestContext, group: ModelGroup, responder: Responder, watch: DisconnectWatch
    ) -> None:
        ctx.attempts = attempts = self.router.loop.begin(stream=False)
        reply = await self.router.dispatch.complete(ctx, group, attempts)
        watch.stop()
        payload = reply.payload if isinstance(reply.payload, dict) else {}
        model = payload.get("model")
        ctx.upstream_headers = reply.headers
        ctx.finish_reason = finish_reason(payload)
        self._settle(
            ctx, model if isinstance(model, str) else ctx.model, payload.get("usage"), None
        )
        if ctx.lookup is not None and reply.status == 200 and is_complete(ctx.path, reply.payload):
            await ctx.lookup.store(reply.body)
        headers = self.expose.filter(reply.headers)
        headers.append(JSON)  # the body parsed as a JSON object, whatever the upstream said
        body = reply.body
        if responder.shape.translates and isinstance(reply.payload, dict):
            body = responder.shape.answer(ctx, reply.payload)
        await responder.answer(reply.status, headers, body)

    async def _stream(
        self, ctx: RequestContext, group: ModelGroup, responder: Responder, watch: DisconnectWatch
    ) -> None:
        send = responder.send
        strip_usage = ctx.usage_added
        recorder: StreamRecorder | None = None
        translator = responder.shape.translator(ctx)
        if translator is not None:  # the shape reads the usage chunk; it never reaches the client
            send = TranslatedSend(send, translator).send
            strip_usage = False
        if ctx.lookup is not None:  # usage is asked for, to be kept with the answer
            hide = ctx.ask_for_usage() and translator is None
            recorder = StreamRecorder(send, ctx.lookup, ctx.path, hide)
            send = recorder.send
            strip_usage = False
        ctx.attempts = attempts = self.router.loop.begin(stream=True)
        opened = await self._open(ctx, group, attempts, responder, send)
        ctx.upstream_headers = opened.stream.headers
        relay = Relay(self.router.dispatch, ctx, group, opened, attempts, self.continuation)
        relay.strip_usage = strip_usage
        if recorder is None:  # nothing keeps the body; a translator may reshape it
            relay.writer = responder.writer
            relay.translator = translator
        try:
            if not responder.started:
                await send(self._stream_start(responder, opened))
            async for chunk in relay.events():
                if relay.ending:  # the last piece ends the response with it: one send less
                    watch.stop()
                    # Billed before the answer completes: a crash after it cannot lose it.
                    self._settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)
                await send(
                    {"type": "http.response.body", "body": chunk, "more_body": not relay.ending}
                )
            if not relay.ending:
                watch.stop()
                self._settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            relay.close()
        ctx.finish_reason = relay.opened.stream.state.finish_reason
        self._settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)

    async def _open(
        self,
        ctx: RequestContext,
        group: ModelGroup,
        attempts: Attempts,
        responder: Responder,
        send: Send,
    ) -> OpenStream:
        """The stream past its first token, the client kept busy meanwhile (keepalive.py).
        A refusal of the request itself (a stream that never started) reaches `_failed`,
        and the client gets that answer unchanged unless the response had started."""
        dispatch = self.router.dispatch
        if self.keepalive is None and not self.headers_at_once:
            return await dispatch.open(ctx, group, attempts)

        async def start() -> None:
            await send(self._stream_start(responder, None))

        if self.headers_at_once:
            await start()
        if self.keepalive is None:
            return await dispatch.open(ctx, group, attempts)
        keepalive = KeepAlive(self.router.clock, self.keepalive, send, start, responder.started)
        try:
            return await dispatch.open(ctx, group, attempts)
        finally:
            await keepalive.stop()

    def _stream_start(self, responder: Responder, opened: OpenStream | None) -> Message:
        headers = [EVENT_STREAM, NO_CACHE]
        if opened is not None:
            headers.append((b"x-ballast-deployment", opened.attempt.id.encode()))
            headers.extend(self.expose.filter(opened.stream.headers))
        headers.extend(responder.extra)
        responder.streaming = True
        return {"type": "http.response.start", "status": 200, "headers": headers}

    # -- answers that are not the upstream's ---------------------------------------------

    async def _passthrough(self, failure: Failure, responder: Responder) -> None:
        headers = self.expose.filter(failure.headers)
        headers.append(JSON)
        status, body = failure.status or 502, failure.body or b""
        if responder.shape.translates:
            status, body = responder.shape.passthrough(status, body)
        await responder.answer(status, headers, body)

    async def _failed(self, failure: Failure, responder: Responder) -> None:
        if is_passthrough(failure) and not responder.started:
            await self._passthrough(failure, responder)
            return
        await responder.error(from_failure(failure))

    # -- settlement ------------------------------------------------------------------

    def _settle(self, ctx: RequestContext, model: str, usage: Any, deployment: str | None) -> None:
        """Usage and spend for the key, exactly once per request (the first call wins)."""
        if ctx.settled:
            return
        ctx.settled = True
        ctx.usage = usage
        ctx.answered_model = model or None
        if isinstance(usage, dict):
            ctx.tokens = token_counts(usage)
        if self.access is not None and ctx.ticket is not None:
            if deployment is None and ctx.attempts is not None:
                deployment = ctx.attempts.deployment  # the one that answered
            self.access.settle(ctx.ticket, model, usage, deployment)

"""The last stage of a proxied request: the attempt loop finds a deployment that answers
(routing/), and its whole answer is sent, or its stream relayed with continuation (relay.py);
usage and spend are settled before the answer's last bytes go out."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from ballast.cache.replay import is_complete
from ballast.config import ModelGroup
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import EVENT_STREAM, JSON, NO_CACHE, DisconnectWatch
from ballast.pipeline.caching import StreamRecorder
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.pipeline.keepalive import KeepAlive
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.relay import Relay
from ballast.pipeline.respond import Responder
from ballast.pipeline.stages import Flow, Next
from ballast.routing.attempt_loop import Attempts
from ballast.routing.dispatch import OpenStream
from ballast.types import Message

log = logging.getLogger("ballast.api")


def finish_reason(payload: dict[str, Any]) -> str | None:
    """The first choice's finish reason of a whole answer (traces record it)."""
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    return None


class Dispatch:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]:
        ctx, group = flow.ctx, flow.group
        assert ctx is not None and group is not None, "dispatch runs after resolve"
        watch = flow.watch
        if watch is None:
            flow.watch = watch = DisconnectWatch(
                flow.receive, self.pipeline.clock, writer=flow.responder.writer
            )
        if ctx.stream:
            return self._stream(ctx, group, flow.responder, watch)
        return self._complete(ctx, group, flow.responder, watch)

    async def _complete(
        self, ctx: RequestContext, group: ModelGroup, responder: Responder, watch: DisconnectWatch
    ) -> None:
        pipeline = self.pipeline
        router = pipeline.router
        ctx.attempts = attempts = router.loop.begin(stream=False)
        reply = await router.dispatch.complete(ctx, group, attempts)
        watch.stop()
        payload = reply.payload if isinstance(reply.payload, dict) else {}
        model = payload.get("model")
        ctx.upstream_headers = reply.headers
        ctx.finish_reason = finish_reason(payload)
        pipeline.settle(
            ctx, model if isinstance(model, str) else ctx.model, payload.get("usage"), None
        )
        if ctx.lookup is not None and reply.status == 200 and is_complete(ctx.path, reply.payload):
            await ctx.lookup.store(reply.body)
        headers = pipeline.expose.filter(reply.headers)
        headers.append(JSON)  # the body parsed as a JSON object, whatever the upstream said
        body = reply.body
        if responder.shape.translates and isinstance(reply.payload, dict):
            body = responder.shape.answer(ctx, reply.payload) or body
        await responder.answer(reply.status, headers, body)

    async def _stream(
        self, ctx: RequestContext, group: ModelGroup, responder: Responder, watch: DisconnectWatch
    ) -> None:
        pipeline = self.pipeline
        recorder: StreamRecorder | None = None
        # The shape's translator reads the usage chunk; it never reaches the client.
        translator = responder.shape.translator(ctx)
        if ctx.lookup is not None:
            ctx.ask_for_usage()  # to be kept with the answer
            recorder = StreamRecorder(ctx.lookup, ctx.path)
        responder.begin_stream(
            translator, recorder, strip_usage=ctx.usage_added and translator is None
        )
        ctx.attempts = attempts = pipeline.router.loop.begin(stream=True)
        opened = await self._open(ctx, group, attempts, responder)
        ctx.upstream_headers = opened.stream.headers
        relay = Relay(pipeline.router.dispatch, ctx, group, opened, attempts, pipeline.continuation)
        relay.client = responder
        try:
            if not responder.started:
                await responder.send(self._stream_start(responder, opened))
            async for piece in relay.events():
                if relay.ending:  # the last piece ends the response with it: one send less
                    watch.stop()
                    # Billed before the answer completes: a crash after it cannot lose it.
                    pipeline.settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)
                if isinstance(piece, ApiError):
                    await responder.fail(piece)
                else:
                    await responder.events(piece, not relay.ending)
            if not relay.ending:
                watch.stop()
                pipeline.settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)
                await responder.events([], False)
        finally:
            relay.close()
            if not ctx.settled:  # cut short: the client left, or the stream was cancelled
                self._settle_cut(ctx, relay)
        ctx.finish_reason = relay.opened.stream.state.finish_reason
        pipeline.settle(ctx, relay.model or ctx.model, relay.usage, relay.deployment)

    def _settle_cut(self, ctx: RequestContext, relay: Relay) -> None:
        """A stream that ended before it was settled is billed for what it relayed: the
        upstream's usage when it came, else an estimate marked as one (spend, log)."""
        model = relay.model or ctx.model
        usage = relay.usage
        if isinstance(usage, dict):
            raised = relay.cut_usage(usage)
            if raised is None:
                self.pipeline.settle(ctx, model, usage, relay.deployment)
            else:  # what was relayed outgrew the upstream's early count: an estimate
                self.pipeline.settle(ctx, model, raised, relay.deployment, estimated=True)
            return
        usage = relay.relayed_usage(estimate_prompt_tokens(ctx))
        self.pipeline.settle(ctx, model, usage, relay.deployment, estimated=True)
        log.info(
            "stream %s cut before its usage came: billed an estimate of %d prompt and %d"
            " completion tokens",
            ctx.request_id,
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )

    async def _open(
        self,
        ctx: RequestContext,
        group: ModelGroup,
        attempts: Attempts,
        responder: Responder,
    ) -> OpenStream:
        """The stream past its first token, the client kept busy meanwhile (keepalive.py).
        A refusal of the request itself (a stream that never started) reaches the guard,
        and the client gets that answer unchanged unless the response had started."""
        pipeline = self.pipeline
        dispatch = pipeline.router.dispatch
        if pipeline.keepalive is None and not pipeline.headers_at_once:
            return await dispatch.open(ctx, group, attempts)

        send = responder.send_raw

        async def start() -> None:
            await send(self._stream_start(responder, None))

        if pipeline.headers_at_once:
            await start()
        if pipeline.keepalive is None:
            return await dispatch.open(ctx, group, attempts)
        keepalive = KeepAlive(
            pipeline.router.clock, pipeline.keepalive, send, start, responder.started
        )
        try:
            return await dispatch.open(ctx, group, attempts)
        finally:
            await keepalive.stop()

    def _stream_start(self, responder: Responder, opened: OpenStream | None) -> Message:
        headers = [EVENT_STREAM, NO_CACHE]
        deployment = None
        if opened is not None:
            deployment = opened.attempt.id
            headers.append((b"x-ballast-deployment", deployment.encode()))
            headers.extend(self.pipeline.expose.filter(opened.stream.headers))
        return responder.start_stream(headers, deployment)

"""`POST /v1/messages/count_tokens`: the input tokens a Messages request would use.

Where the model group has a deployment with a count of its own (`provider: anthropic`,
served `messages: native`), the first such one in the group's order that is ready (breaker
closed, not cooling, not drained) is asked at its own `/v1/messages/count_tokens`, as a
native Messages request is sent: the client's body with the model name rewritten and
Ballast's own fields taken out, the deployment's key, the client's `anthropic-version` and
`anthropic-beta`. Its answer comes back as it is (`x-ballast-count: upstream`, and
`x-ballast-deployment`). An upstream 400 or 413 is about the body and reaches the client;
any other failure, like a group with no such deployment, gets the gateway's estimate (the
same one the rate limits use: the translated chat body's bytes / 4, which errs high) and
`x-ballast-count: estimate`. A count is not a verdict on the deployment's health: a
count endpoint an Anthropic-compatible server lacks must not open the breaker of the
messages it does serve.

The route runs the request stages up to resolve, so the key and the model are checked as
for a request; then the key's model list. No rate limit is used."""

from __future__ import annotations

import logging

import orjson

from ballast.api.messages.shape import MessagesShape, keep_own
from ballast.config import ModelGroup
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import JSON
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next
from ballast.resilience.failures import Failure
from ballast.routing.targets import Target
from ballast.upstream.answer import Reply, fetch
from ballast.upstream.client import UpstreamRequest

log = logging.getLogger("ballast.api")

COUNT_HEADER = b"x-ballast-count"
_THE_CLIENTS = (400, 413)  # an upstream's refusal of the body itself


class CountingShape(MessagesShape):
    """A count_tokens body: a Messages request that need not say how long its answer may be.
    It is read as a native request; its chat form is made only for an estimate."""

    def bind(self, ctx: RequestContext, group: ModelGroup) -> None:
        keep_own(ctx)


COUNTING = CountingShape()


class CountTokens:
    """The last stage of the count_tokens route."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        ctx, group = flow.ctx, flow.group
        assert ctx is not None and group is not None, "counting runs after resolve"
        if flow.key is not None and not flow.key.allows(ctx.model):
            raise ApiError(403, f"This key may not use the model '{ctx.model[:200]}'.")
        counted = await self._native(ctx, group)
        if counted is not None:
            target, reply = counted
            ctx.upstream_headers = reply.headers
            headers = self.pipeline.expose.filter(reply.headers)
            headers += [JSON, (COUNT_HEADER, b"upstream")]
            headers.append((b"x-ballast-deployment", target.id.encode()))
            await flow.responder.answer(200, headers, reply.body)
            return
        estimate = estimate_prompt_tokens(COUNTING.translated(ctx.payload, counting=True))
        answer = orjson.dumps({"input_tokens": estimate})
        await flow.responder.answer(200, [JSON, (COUNT_HEADER, b"estimate")], answer)

    async def _native(self, ctx: RequestContext, group: ModelGroup) -> tuple[Target, Reply] | None:
        """The count of the group's first ready deployment that has one; None when none
        has, or it could not answer."""
        router = self.pipeline.router
        clock = router.clock
        now = clock.monotonic()
        for target in router.deployments.ranked(group):
            if not target.ready(now):
                continue
            wire = target.adapter.count_wire(ctx)
            if wire is None:
                continue
            body = target.adapter.body(ctx, ctx.model)
            until = now + router.settings.timeouts.request
            request = UpstreamRequest(ctx.path, body, wire, ctx.request_id, None, until)
            try:
                reply = await fetch(target.upstream, request, clock)
            except Failure as failure:
                if failure.status in _THE_CLIENTS:
                    raise
                log.info("count_tokens on %s failed (%s): estimated", target.id, failure)
                return None
            payload = reply.payload
            if isinstance(payload, dict) and isinstance(payload.get("input_tokens"), int):
                return target, reply
            log.info("count_tokens on %s answered no input_tokens: estimated", target.id)
            return None
        return None

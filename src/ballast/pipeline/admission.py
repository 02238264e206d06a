"""Two stages over the access rules (access.py): `Authenticate` knows the caller before
anything else is read, so a caller without a valid key gets the same answer whatever model
it names; `Admit` holds a request whose model resolved to the key's model list, budget and
rate limits.

Both hand the request on without a coroutine of their own when there is nothing to wait for
(Ballast running open, a key seen recently): a stage costs a request only what it does."""

from __future__ import annotations

from collections.abc import Awaitable

from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next


class Authenticate:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]:
        flow.authorization = authorization = flow.shape.authorization(flow.scope)
        access = self.pipeline.access
        if access is None or access.open_now():
            return call_next(flow)
        key = access.recent(authorization)
        if key is None:
            return self._identify(flow, call_next)
        flow.key = key
        return call_next(flow)

    async def _identify(self, flow: Flow, call_next: Next) -> None:
        access = self.pipeline.access
        assert access is not None
        flow.key = await access.identify(flow.scope, flow.authorization)
        await call_next(flow)


class Admit:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]:
        if flow.key is None or self.pipeline.access is None:
            return call_next(flow)
        return self._admit(flow, call_next)

    async def _admit(self, flow: Flow, call_next: Next) -> None:
        access, key, ctx = self.pipeline.access, flow.key, flow.ctx
        assert access is not None and key is not None and ctx is not None
        ctx.ticket = ticket = await access.admit(key, ctx)
        if ticket.lease is not None:
            flow.responder.extra.extend(ticket.lease.headers)
        if ctx.stream:
            ctx.ask_for_usage()
        await call_next(flow)

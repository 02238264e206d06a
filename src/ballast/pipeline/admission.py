"""Two stages over the access rules (access.py): `Authenticate` knows the caller before
anything else is read, so a caller without a valid key gets the same answer whatever model
it names; `Admit` holds a request whose model resolved to the key's model list, budget and
rate limits."""

from __future__ import annotations

from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next


class Authenticate:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        flow.authorization = authorization = flow.shape.authorization(flow.scope)
        access = self.pipeline.access
        if access is not None:
            flow.key = await access.identify(flow.scope, authorization)
        await call_next(flow)


class Admit:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        access, key, ctx = self.pipeline.access, flow.key, flow.ctx
        if access is not None and key is not None and ctx is not None:
            ctx.ticket = ticket = await access.admit(key, ctx)
            if ticket.lease is not None:
                flow.responder.extra.extend(ticket.lease.headers)
            if ctx.stream:
                ctx.ask_for_usage()
        await call_next(flow)

"""The stage that finds the model group a request names (after its key was checked), and
lets the route's shape decide what it could not before knowing it (Responses: native or
bridged)."""

from __future__ import annotations

from collections.abc import Awaitable

from ballast.pipeline.errors import model_not_found
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next


class Resolve:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]:
        ctx = flow.ctx
        assert ctx is not None, "resolve runs after read"
        group = self.pipeline.router.resolve(ctx.model)
        if group is None:
            raise model_not_found(ctx.model)
        ctx.group = flow.group = group
        flow.shape.bind(ctx, group)
        return call_next(flow)

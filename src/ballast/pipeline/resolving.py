"""The stage that finds the model group a request names (after its key was checked), and
lets the route's shape decide what it could not before knowing it (Responses and Messages:
native or bridged). What the translation had to leave out is named to the client in the
`x-ballast-dropped` header, or refused where the group asks for that (`strict_params`)."""

from __future__ import annotations

from collections.abc import Awaitable

from ballast.pipeline.errors import bad_request, model_not_found
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next

DROPPED_HEADER = b"x-ballast-dropped"


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
        dropped = ctx.dropped
        if dropped:
            if group.strict_params:
                name = dropped[0]
                raise bad_request(
                    f"{name}: not supported for this model (no deployment of it can honour"
                    " it, and its group has strict_params)",
                    name,
                )
            flow.responder.extra.append((DROPPED_HEADER, ",".join(dropped).encode()))
        return call_next(flow)

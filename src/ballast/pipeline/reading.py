"""The stage that reads the request: a JSON body of bounded size that arrives in time, parsed
by the route's API shape into the pipeline's request (a RequestContext)."""

from __future__ import annotations

from ballast.pipeline.asgi import Scope, read_body, require_json
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.stages import Flow, Next


class Read:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        pipeline, scope = self.pipeline, flow.scope
        require_json(scope)
        body = await read_body(
            scope, flow.receive, pipeline.max_body_bytes, pipeline.body_timeout, pipeline.clock
        )
        ctx = flow.shape.parse(flow.path, body)
        ctx.request_id = flow.responder.request_id
        ctx.shape = flow.shape.name
        ctx.authorization = flow.authorization
        names = flow.shape.forwards
        if names:
            ctx.forwarded = forwarded(scope, names)
        flow.ctx = ctx
        await call_next(flow)


def forwarded(scope: Scope, names: tuple[bytes, ...]) -> tuple[tuple[str, str], ...]:
    """The request's headers of these names, as sent (a repeated one joined with commas)."""
    found = [(name, value) for name, value in scope["headers"] if name in names]
    if not found:
        return ()
    joined: dict[str, str] = {}
    for name, value in found:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        joined[key] = text if key not in joined else f"{joined[key]},{text}"
    return tuple(joined.items())

"""The outermost stage: a request's span (when tracing is on), and, once it ended however it
ended, its line in the request log and its metrics."""

from __future__ import annotations

import logging

from ballast.observe.hub import Observer
from ballast.observe.tracing import request_attributes
from ballast.pipeline.stages import Flow, Next
from ballast.routing.router import Router
from ballast.state.store import scope_request

log = logging.getLogger("ballast.api")


class Observe:
    def __init__(self, observer: Observer, router: Router) -> None:
        self.observer = observer
        self.router = router

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        scope_request()
        tracer = self.router.tracer
        try:
            if tracer is None:
                await call_next(flow)
            else:
                parent = tracer.incoming(flow.scope["headers"])
                with tracer.span(
                    "ballast.request", parent, path=flow.path, shape=flow.shape.name
                ) as span:
                    try:
                        await call_next(flow)
                    finally:
                        attributes = request_attributes(flow.path, flow.ctx)
                        attributes["http.response.status_code"] = flow.responder.status or None
                        tracer.annotate(span, attributes)
        finally:
            try:
                self.observer.request(
                    flow.responder,
                    flow.ctx,
                    self.router,
                    flow.path,
                    flow.client_gone,
                    flow.key,
                    flow.scope["path"],
                )
            except Exception:
                log.exception("could not record a request")

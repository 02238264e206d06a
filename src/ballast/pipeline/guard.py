"""The stage that turns whatever the rest raised into the answer that still fits, and that
ends every request the same way: settled once, its cache wait and its attempts released."""

from __future__ import annotations

import asyncio
import logging

from ballast.config import MASK, scrub
from ballast.pipeline.asgi import JSON, ClientGone
from ballast.pipeline.errors import ApiError, from_failure
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.respond import Responder
from ballast.pipeline.stages import Flow, Next
from ballast.resilience.failures import Action, Failure
from ballast.types import WRITE_TIMED_OUT

log = logging.getLogger("ballast.api")


def is_passthrough(failure: Failure) -> bool:
    """An upstream's own refusal of the request itself: the client sees it unchanged."""
    return failure.status is not None and failure.kind.action in (
        Action.RETURN,
        Action.CONTEXT_FALLBACK,
    )


class Guard:
    """Errors become answers in the client's shape (a status and body before the response
    started, an error event in a started stream); a client that left is noted, not answered."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        try:
            await call_next(flow)
        except ApiError as error:
            if flow.watch is not None:
                flow.watch.stop()
            await flow.responder.error(error)
        except Failure as failure:
            if flow.watch is not None:
                flow.watch.stop()
            await self._failed(failure, flow.responder)
        except ClientGone:
            flow.client_gone = True
        except asyncio.CancelledError:
            if flow.watch is None or not flow.watch.fired:
                raise
            flow.client_gone = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self._client_gone(flow)
        finally:
            if flow.watch is not None:
                flow.watch.stop()
            ctx = flow.ctx
            if ctx is not None:
                if not ctx.settled:
                    self.pipeline.settle(ctx, "", None, None)  # frees the slot if nothing did
                if ctx.lookup is not None:
                    ctx.lookup.done()  # identical requests waiting on this one go on
                if ctx.attempts is not None:
                    ctx.attempts.end()

    async def _failed(self, failure: Failure, responder: Responder) -> None:
        if not is_passthrough(failure) or responder.started:
            await responder.error(from_failure(failure))
            return
        headers = self.pipeline.expose.filter(failure.headers)
        headers.append(JSON)
        status, body = failure.status or 502, failure.body or b""
        body = scrub(body, self.pipeline.secrets, MASK.encode())  # an upstream echoing our key
        if responder.shape.translates:
            status, body = responder.shape.passthrough(status, body)
        await responder.answer(status, headers, body)

    def _client_gone(self, flow: Flow) -> None:
        """The client went away, or stopped reading for `client_write_timeout` (the server
        then aborted its connection): its upstream request was dropped."""
        reason = "write_timeout" if flow.scope.get(WRITE_TIMED_OUT) else "disconnect"
        attempts = flow.ctx.attempts if flow.ctx is not None else None
        deployment = attempts.deployment if attempts is not None else None
        fields = {"deployment": deployment or "none", "reason": reason}
        router = self.pipeline.router
        router.loop.on_event("client_gone", fields)
        log.info("client gone (%s); upstream request %s dropped", reason, flow.responder.request_id)

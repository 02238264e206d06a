"""`POST /v1/messages/count_tokens`: the input tokens a Messages request would use.

None of the upstream protocols Ballast speaks today has a count of its own for a chat
request, so the answer is the gateway's estimate, the same one the rate limits use: the
translated chat body's bytes / 4 (docs/shapes.md). It errs high, which is the side a client
planning a context window wants. The key and the model are checked as for a request; no
upstream is asked and no rate limit is used."""

from __future__ import annotations

import orjson

from ballast.api.messages.shape import MESSAGES
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import JSON, ClientGone, read_body, require_json
from ballast.pipeline.errors import ApiError, model_not_found
from ballast.pipeline.pipeline import Pipeline, request_id
from ballast.pipeline.respond import Responder
from ballast.types import Receive, Scope, Send


async def count_tokens(pipeline: Pipeline, scope: Scope, receive: Receive, send: Send) -> None:
    responder = Responder(send, [(b"x-request-id", request_id(scope))], MESSAGES)
    try:
        require_json(scope)
        body = await read_body(
            scope, receive, pipeline.max_body_bytes, pipeline.body_timeout, pipeline.clock
        )
        ctx = MESSAGES.context(body, counting=True)
        access = pipeline.access
        if access is not None and access.enabled:
            key = await access.authenticate(scope, MESSAGES.authorization(scope))
            if not key.allows(ctx.model):
                raise ApiError(403, f"This key may not use the model '{ctx.model[:200]}'.")
        if pipeline.router.resolve(ctx.model) is None:
            raise model_not_found(ctx.model)
        answer = orjson.dumps({"input_tokens": estimate_prompt_tokens(ctx)})
        await responder.answer(200, [JSON], answer)
    except ApiError as error:
        await responder.error(error)
    except ClientGone:
        return

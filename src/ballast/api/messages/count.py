"""`POST /v1/messages/count_tokens`: the input tokens a Messages request would use.

None of the upstream protocols Ballast speaks today has a count of its own for a chat
request, so the answer is the gateway's estimate, the same one the rate limits use: the
translated chat body's bytes / 4 (docs/shapes.md). It errs high, which is the side a client
planning a context window wants. The route runs the request stages up to resolve, so the
key and the model are checked as for a request; then the key's model list. No upstream is
asked and no rate limit is used."""

from __future__ import annotations

import orjson

from ballast.api.messages.shape import MessagesShape
from ballast.config import ModelGroup
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import JSON
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.pipeline.stages import Flow, Next


class CountingShape(MessagesShape):
    """A count_tokens body: a Messages request that need not say how long its answer may be."""

    def parse(self, path: str, body: bytes) -> RequestContext:
        return self.context(body, counting=True)

    def bind(self, ctx: RequestContext, group: ModelGroup) -> None:
        """Nothing to decide: the count is the translated body's, whoever would answer."""


COUNTING = CountingShape()


async def count_tokens(flow: Flow, call_next: Next) -> None:
    """The last stage of the count_tokens route."""
    ctx = flow.ctx
    assert ctx is not None, "counting runs after read"
    if flow.key is not None and not flow.key.allows(ctx.model):
        raise ApiError(403, f"This key may not use the model '{ctx.model[:200]}'.")
    answer = orjson.dumps({"input_tokens": estimate_prompt_tokens(ctx)})
    await flow.responder.answer(200, [JSON], answer)

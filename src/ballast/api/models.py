"""`GET /v1/models` and `GET /v1/models/{id}`: the models the caller's key may use. Their
routes run the request stages up to authenticate (a key is needed as soon as keys are in
use, as for every /v1 request), then one of these."""

from __future__ import annotations

import orjson

from ballast.pipeline.asgi import JSON
from ballast.pipeline.errors import model_not_found
from ballast.pipeline.stages import Flow, Next
from ballast.routing.router import Router

MODELS_PREFIX = "/v1/models/"


def _model_object(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "ballast"}


class ModelList:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        key = flow.key
        data = [
            _model_object(name)
            for name in self.router.public_models()
            if key is None or key.allows(name)
        ]
        body = orjson.dumps({"object": "list", "data": data})
        await flow.responder.answer(200, [JSON], body)


class ModelInfo:
    """OpenAI's model object, or its 404 for a model that does not exist or that the key
    may not use (the key cannot tell the two apart)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, flow: Flow, call_next: Next) -> None:
        name = flow.scope["path"][len(MODELS_PREFIX) :]
        key = flow.key
        allowed = key is None or key.allows(name)
        if not name or self.router.resolve(name) is None or not allowed:
            raise model_not_found(name)
        await flow.responder.answer(200, [JSON], orjson.dumps(_model_object(name)))

"""The OpenAI-compatible surface: chat completions, completions, embeddings and the model
list. The hot path reads the body once, looks only at what it must (`model`, `stream`,
`fallbacks` and a few bounded counts) and forwards the client's bytes unless something
must change."""

from __future__ import annotations

import orjson

from ballast.pipeline.asgi import JSON, send_bytes, send_error
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError, bad_request, model_not_found
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.shape import Shape
from ballast.state.keys import KeyRecord
from ballast.types import Receive, Scope, Send

# Counts checked before routing (cheap; an absurd value would only fail upstream, or worse,
# make an upstream try): (name, lowest, highest).
_BOUNDED = (
    ("n", 1, 128),
    ("max_tokens", 0, 1 << 24),
    ("max_completion_tokens", 0, 1 << 24),
)


def parse_request(path: str, body: bytes) -> RequestContext:
    """The client's request as the pipeline needs it; clear 400s for anything unusable."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("We could not parse the JSON body of your request.") from None
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("You must provide a model parameter.", "model")
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", "stream")
    if stream and path == "/embeddings":
        raise bad_request("Embeddings cannot be streamed.", "stream")
    for name, low, high in _BOUNDED:
        value = payload.get(name)
        if value is not None and (
            type(value) is not int or value < low or value > high  # bool is not a count
        ):
            raise bad_request(f"'{name}' must be an integer from {low} to {high}.", name)
    request = RequestContext(path, payload, body, model, stream)
    if "fallbacks" in payload:
        given = payload["fallbacks"]
        if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
            raise bad_request("'fallbacks' must be a list of model names.", "fallbacks")
        request.fallbacks = tuple(given)
        request.edits["fallbacks"] = None  # Ballast's own field: never forwarded
    return request


class OpenAIShape(Shape):
    """OpenAI's API, the pipeline's own terms: parsed, never translated."""

    name = "openai"

    def parse(self, path: str, body: bytes) -> RequestContext:
        return parse_request(path, body)


OPENAI = OpenAIShape()


class OpenAIHandlers:
    """The proxied endpoints on one pipeline: OpenAI's, and those of any other inbound
    `shape` (which translates to and from the same chat terms)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def proxy(
        self, scope: Scope, receive: Receive, send: Send, path: str, shape: Shape = OPENAI
    ) -> None:
        await self.pipeline.handle(scope, receive, send, path, shape)

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /v1/models`: the models the caller's key may use (a key is needed as soon as
        keys are in use, as for every /v1 request)."""
        try:
            key = await self._key(scope)
        except ApiError as error:
            await send_error(send, error, [])
            return
        data = [
            _model_object(name)
            for name in self.pipeline.router.public_models()
            if key is None or key.allows(name)
        ]
        await send_bytes(send, 200, [JSON], orjson.dumps({"object": "list", "data": data}))

    async def model(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        """`GET /v1/models/{id}`: OpenAI's model object, or its 404 for a model that does not
        exist or that the key may not use (the key cannot tell the two apart)."""
        try:
            key = await self._key(scope)
            if (
                not name
                or self.pipeline.router.resolve(name) is None
                or (key is not None and not key.allows(name))
            ):
                raise model_not_found(name)
        except ApiError as error:
            await send_error(send, error, [])
            return
        await send_bytes(send, 200, [JSON], orjson.dumps(_model_object(name)))

    async def _key(self, scope: Scope) -> KeyRecord | None:
        """The caller's key; None while Ballast runs open."""
        access = self.pipeline.access
        if access is None or not await access.required():
            return None
        return await access.authenticate(scope)


def _model_object(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "ballast"}

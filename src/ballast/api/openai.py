"""The OpenAI-compatible shape: chat completions, completions and embeddings. The hot path
reads the body once, looks only at what it must (`model`, `stream`, `fallbacks` and a few
bounded counts) and forwards the client's bytes unless something must change."""

from __future__ import annotations

from ballast.pipeline.context import RequestContext
from ballast.pipeline.duplicate_keys import DuplicateKeys
from ballast.pipeline.errors import bad_request
from ballast.pipeline.shape import Shape

# Counts checked before routing (cheap; an absurd value would only fail upstream, or worse,
# make an upstream try): (name, lowest, highest).
_BOUNDED = (
    ("n", 1, 128),
    ("max_tokens", 0, 1 << 24),
    ("max_completion_tokens", 0, 1 << 24),
)
# The fields read from the body here and on the way (pricing, the cache, continuation and
# hedging): none may be given twice.
_DUPLICATES = DuplicateKeys(
    (
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "fallbacks",
        "cache",
        "logprobs",
        "best_of",
        "echo",
    )
)


def parse_request(path: str, body: bytes) -> RequestContext:
    """The client's request as the pipeline needs it; clear 400s for anything unusable."""
    payload = _DUPLICATES.load(body)
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

"""The client API's routes, and the one list of stages they run, assembled per configuration
generation. Every request passes, in this order, as far as its route needs:

1. observe       its span, and its request-log line and metrics once it ended
                 (pipeline/observing.py);
2. guard         errors become answers in the client's API shape; the request is settled
                 once and what it holds is released, however it ended (pipeline/guard.py);
3. authenticate  the caller's key, before anything else is read: without a valid key every
                 model name gets the same answer (pipeline/admission.py);
4. read          a bounded JSON body, parsed by the route's shape (pipeline/reading.py);
5. resolve       the model group, or 404; the shape decides what needed the group
                 (pipeline/resolving.py);
6. admit         the key's model list, budget reservation and rate limits (admission.py);
7. cache         an answer kept for an identical request (pipeline/caching.py);
8. dispatch      the attempt loop, then the whole answer or the relayed stream, settled
                 before its last bytes (pipeline/dispatching.py).

The proxied routes (chat, completions, embeddings, responses, messages) run all eight;
count_tokens runs 1-5 and counts (a deployment's own count where it has one); the model
list runs 1-3 and lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ballast.api.messages import COUNTING, CountTokens
from ballast.api.models import ModelInfo, ModelList
from ballast.api.openai import OPENAI
from ballast.observe.hub import Observer
from ballast.pipeline.admission import Admit, Authenticate
from ballast.pipeline.caching import Cache
from ballast.pipeline.dispatching import Dispatch
from ballast.pipeline.guard import Guard
from ballast.pipeline.observing import Observe
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.reading import Read
from ballast.pipeline.resolving import Resolve
from ballast.pipeline.respond import Responder, request_id
from ballast.pipeline.shape import Shape
from ballast.pipeline.stages import Flow, Next, Stage, fold
from ballast.types import BODY_WRITER, Receive, Scope, Send


class Generation(Protocol):
    """What a route keeps of the configuration generation it belongs to (api/reload.py):
    the count of requests running on it, and the observer's clock."""

    in_flight: int
    observer: Observer

    def left(self) -> None: ...


def request_stages(pipeline: Pipeline, observer: Observer) -> list[Stage]:
    """Stages 1-7 of the list above, in that order (each route adds its last one)."""
    return [
        Observe(observer, pipeline.router),
        Guard(pipeline),
        Authenticate(pipeline),
        Read(pipeline),
        Resolve(pipeline),
        Admit(pipeline),
        Cache(pipeline),
    ]


_AUTHENTICATE, _RESOLVE = 3, 5  # how many of the stages the shorter routes run


class Route:
    """One client route: the stages it runs, folded once, and the request's first moves
    (its id, the one writer of its response, the generation's count of running requests)."""

    __slots__ = ("_handler", "generation", "path", "shape")

    def __init__(
        self, generation: Generation, stages: Sequence[Stage], path: str, shape: Shape
    ) -> None:
        self.generation = generation
        self.path = path  # the upstream API: "/chat/completions", ...
        self.shape = shape
        self._handler: Next = fold(stages)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        generation = self.generation
        generation.in_flight += 1
        try:
            responder = Responder(
                send,
                request_id(scope),
                self.shape,
                scope.get(BODY_WRITER),
                generation.observer.monotonic,
            )
            await self._handler(Flow(scope, receive, responder, self.path, self.shape))
        finally:
            generation.left()


def build_routes(
    generation: Generation,
    pipeline: Pipeline,
    observer: Observer,
    responses: Shape,
    messages: Shape,
) -> tuple[dict[str, Route], dict[str, Route]]:
    """(POST routes, GET routes) by path, for one generation."""
    stages = request_stages(pipeline, observer)
    proxied: list[Stage] = [*stages, Dispatch(pipeline)]

    def route(path: str, shape: Shape, these: Sequence[Stage] = proxied) -> Route:
        return Route(generation, these, path, shape)

    post = {
        "/v1/chat/completions": route("/chat/completions", OPENAI),
        "/v1/completions": route("/completions", OPENAI),
        "/v1/embeddings": route("/embeddings", OPENAI),
        "/v1/responses": route("/responses", responses),
        "/v1/messages": route("/messages", messages),
        "/v1/messages/count_tokens": route(
            "/chat/completions", COUNTING, [*stages[:_RESOLVE], CountTokens(pipeline)]
        ),
    }
    head = stages[:_AUTHENTICATE]
    get = {
        "/v1/models": route("/models", OPENAI, [*head, ModelList(pipeline.router)]),
        "/v1/models/": route("/models", OPENAI, [*head, ModelInfo(pipeline.router)]),
    }
    return post, get

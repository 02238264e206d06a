"""An inbound API shape: where a client's wire format meets the pipeline's terms.

The pipeline speaks chat completions: its request is a RequestContext whose payload and
edits describe the chat request an upstream gets, its whole answer is a chat completion and
its stream is chat SSE events. A shape translates between that and its own wire exactly
once, here, for every request of that shape:

- `parse`: the client's body -> the RequestContext (in chat terms);
- `answer`: a whole chat answer -> the shape's body;
- `translator`: a stream's typed chat events (with the keep-alive comments) -> the shape's
  events, one translator per request, with a final flush, and the error that ends a stream
  broken past healing in the shape's own terms;
- `error` / `error_event`: an ApiError -> the shape's status and body, or its in-stream event;
- `passthrough`: an upstream's own refusal of the request -> the shape's status and body.

The attempt loop, the watchdogs, keep-alive, continuation, the cache and settlement never
know which shape a request came in: they run once, on the chat terms. The OpenAI shape is
the pipeline's own, so it translates nothing (`translates` is False) and its bytes pass as
they are. A translator reads the events' parsed data (`StreamEvent.json`), never the bytes
again."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import orjson

from ballast.config import Deployment, ModelGroup
from ballast.pipeline.asgi import Scope, header
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.stream.event import StreamEvent


class StreamTranslator(Protocol):
    """One request's stream, from typed chat events to the shape's events."""

    def feed(self, events: list[StreamEvent]) -> bytes:
        """The shape's bytes for `events`, whole chat events (or keep-alive comments)."""
        ...

    def finish(self) -> bytes:
        """What ends the shape's stream once the chat stream has ended (may be empty)."""
        ...

    def fail(self, error: ApiError) -> bytes:
        """What ends the shape's stream with `error`, once it broke past healing."""
        ...


class Rendering:
    """How a request's answers, streams and errors look to its client. This base is OpenAI's
    own rendering (the pipeline's terms: nothing to translate); every other shape overrides
    what differs. The Responder uses it alone where no shape is named."""

    name: ClassVar[str] = "openai"
    # False: answers, streams and passthrough bodies are already in the client's shape.
    translates: ClassVar[bool] = False

    def answer(self, ctx: RequestContext, payload: dict[str, Any]) -> bytes | None:
        """A whole chat answer in the shape's body (asked of translating shapes only; here
        the chat answer itself); None: the upstream's body is the shape's own, sent as it
        came (a native pass-through)."""
        return orjson.dumps(payload)

    def translator(self, ctx: RequestContext) -> StreamTranslator | None:
        """A new translator for one stream; None when the chat events are the shape's."""
        return None

    def error(self, error: ApiError) -> tuple[int, bytes]:
        """(status, body) of an error before the response started."""
        return error.status, error.body()

    def error_event(self, error: ApiError) -> bytes:
        """The event that ends a started stream with `error`."""
        return error.event()

    def passthrough(self, status: int, body: bytes) -> tuple[int, bytes]:
        """(status, body) for an upstream's own refusal, given in OpenAI's shape."""
        return status, body


class Shape(Rendering, ABC):
    """An inbound API: its rendering, and how its requests are read."""

    # The request headers a native upstream of this shape reads, forwarded as they came.
    forwards: ClassVar[tuple[bytes, ...]] = ()

    @abstractmethod
    def parse(self, path: str, body: bytes) -> RequestContext:
        """The client's body as the pipeline's (chat) request; ApiError for a bad one."""

    def authorization(self, scope: Scope) -> bytes | None:
        """The credential, as an `Authorization` header value (what the key lookup reads)."""
        return header(scope, b"authorization")

    def bind(self, ctx: RequestContext, group: ModelGroup) -> None:
        """What the shape decides once the request's model group is known (after its key
        was checked); most shapes decide everything in `parse`."""


Resolve = Callable[[str], ModelGroup | None]
W = TypeVar("W", bound=Hashable)


class Modes(Generic[W]):
    """How the deployments that may answer a request serve a shape (`native` or `bridge`,
    or whatever `mode` reads off each deployment): the group's, its fallbacks' and the
    request's own fallbacks'. Decided once per group object (a reloaded configuration brings
    new ones); requests naming their own fallbacks decide anew."""

    def __init__(self, resolve: Resolve, mode: Callable[[Deployment], W]) -> None:
        self._resolve = resolve  # the model groups of the configuration now serving
        self._mode = mode
        self._known: dict[int, tuple[ModelGroup, frozenset[W]]] = {}

    def of(self, group: ModelGroup, fallbacks: Iterable[str]) -> frozenset[W]:
        if not fallbacks:
            known = self._known.get(id(group))
            if known is not None and known[0] is group:
                return known[1]
        groups = [group]
        for name in [*group.fallbacks, *fallbacks, *group.context_fallbacks]:
            found = self._resolve(name)
            if found is not None:
                groups.append(found)
        modes = frozenset(self._mode(d) for g in groups for d in g.deployments)
        if not fallbacks:
            if len(self._known) >= 4096:
                self._known.clear()
            self._known[id(group)] = (group, modes)
        return modes

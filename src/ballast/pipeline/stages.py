"""One signature for every stage, and the fold that makes a list of them one handler.

A stage is `async (flow, call_next)`: it does its part of one request, calls `call_next`
to hand the request on (or answers it and does not), and may act after the rest has run.
The list is data, written once where the app is assembled (app.py), folded here once per
configuration generation: a request pays one call per stage it passes, nothing more."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Protocol

from ballast.types import Receive, Scope

if TYPE_CHECKING:
    from ballast.config import ModelGroup
    from ballast.pipeline.asgi import DisconnectWatch
    from ballast.pipeline.context import RequestContext
    from ballast.pipeline.respond import Responder
    from ballast.pipeline.shape import Shape
    from ballast.state.keys import KeyRecord


class Flow:
    """One client request as the stages hand it on: what came in, the one writer of what
    goes out, and what the stages found so far (the key, the request, its model group)."""

    __slots__ = (
        "authorization",
        "client_gone",
        "ctx",
        "group",
        "key",
        "path",
        "receive",
        "responder",
        "scope",
        "shape",
        "watch",
    )

    def __init__(
        self, scope: Scope, receive: Receive, responder: Responder, path: str, shape: Shape
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.responder = responder
        self.path = path  # the upstream API the route speaks: "/chat/completions", ...
        self.shape = shape
        self.authorization: bytes | None = None  # as the shape reads it; set by authenticate
        self.key: KeyRecord | None = None  # set by authenticate, when keys are in use
        self.ctx: RequestContext | None = None  # set by read
        self.group: ModelGroup | None = None  # set by resolve
        self.watch: DisconnectWatch | None = None  # set once the request may wait upstream
        self.client_gone = False  # the client left (or stopped reading) before the end

    def __repr__(self) -> str:
        model = self.ctx.model if self.ctx is not None else None
        return f"<Flow {self.path} shape={self.shape.name} model={model!r}>"


Next = Callable[[Flow], Awaitable[None]]


class Stage(Protocol):
    """`async (flow, call_next)`: a class with this `__call__`, or such a function."""

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]: ...


async def _end(flow: Flow) -> None:
    """Past the last stage: a list whose last stage called on. Nothing is left to do."""


def fold(stages: Sequence[Stage]) -> Next:
    """The stages as one handler, the first outermost: each gets the rest as `call_next`."""
    handler: Next = _end
    for stage in reversed(stages):
        handler = partial(stage, call_next=handler)
    return handler

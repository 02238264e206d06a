"""The response cache on the HTTP side: per-request control, serving a hit (as a body or as
an SSE stream), and watching a streamed miss so its whole answer can be kept.

Per request, either the header `x-ballast-cache` or a body field `cache` (which Ballast strips
before forwarding) says what the cache may do:

- `on` / `true` (the default): answer from the cache when possible, keep the answer;
- `refresh` / `{"no-cache": true}`: do not answer from the cache, keep the new answer;
- `no-store` / `{"no-store": true}`: answer from the cache when possible, keep nothing new;
- `off` / `false` / `{"no-cache": true, "no-store": true}`: leave the cache alone.

The response says what happened in `x-ballast-cache`: `hit`, `miss` or `bypass`."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from ballast.cache.replay import replay
from ballast.cache.service import DEFAULT, NO_STORE, OFF, REFRESH, Lookup, Mode
from ballast.pipeline.asgi import (
    EVENT_STREAM,
    JSON,
    NO_CACHE,
    DisconnectWatch,
    Scope,
    Send,
    header,
    send_bytes,
)
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import bad_request
from ballast.pipeline.pipeline import Pipeline
from ballast.pipeline.shape import Rendering
from ballast.pipeline.stages import Flow, Next
from ballast.stream.assemble import assemble
from ballast.stream.event import StreamEvent, raw

if TYPE_CHECKING:
    from ballast.pipeline.access import Access
    from ballast.pipeline.context import Ticket

HEADER = b"x-ballast-cache"
_WORDS: dict[str, Mode] = {
    "on": DEFAULT,
    "true": DEFAULT,
    "default": DEFAULT,
    "refresh": REFRESH,
    "no-cache": REFRESH,
    "no-store": NO_STORE,
    "off": OFF,
    "false": OFF,
    "bypass": OFF,
}


def take_field(request: RequestContext) -> Any:
    """The body's `cache` field, which is never forwarded."""
    request.edits["cache"] = None
    return request.payload.get("cache")


def mode_of(scope: Scope, field: Any) -> Mode:
    """The request's cache mode, from the header (first) or the body field."""
    given = header(scope, HEADER)
    if given is not None:
        mode = _WORDS.get(given.decode("latin-1").strip().lower())
        if mode is None:
            raise bad_request(f"'{HEADER.decode()}' must be one of on, refresh, no-store, off.")
        return mode
    if field is None or field is True:
        return DEFAULT
    if field is False:
        return OFF
    if isinstance(field, str) and field.lower() in _WORDS:
        return _WORDS[field.lower()]
    if isinstance(field, dict):
        no_cache, no_store = field.get("no-cache", False), field.get("no-store", False)
        if isinstance(no_cache, bool) and isinstance(no_store, bool):
            return Mode(read=not no_cache, write=not no_store)
    raise bad_request(
        '\'cache\' must be true, false, "refresh", "no-store" or '
        '{"no-cache": bool, "no-store": bool}.',
        "cache",
    )


def scope_of(ticket: Ticket | None, request: RequestContext) -> str:
    """Whose entries these are: the key's id, or the (already hashed) credential when open."""
    return ticket.key.id if ticket is not None else request.credential


def wants_usage(request: RequestContext, added_by_us: bool) -> bool:
    options = request.payload.get("stream_options")
    return not added_by_us and isinstance(options, dict) and bool(options.get("include_usage"))


async def send_hit(
    send: Send,
    request: RequestContext,
    lookup: Lookup,
    extra: list[tuple[bytes, bytes]],
    include_usage: bool,
    shape: Rendering,
) -> None:
    """The kept (chat) answer, in the client's shape: as it is for OpenAI's."""
    assert lookup.body is not None
    if not request.stream:
        body = lookup.body
        if shape.translates:
            body = shape.answer(request, orjson.loads(body)) or body
        await send_bytes(send, 200, [JSON, *extra], body)
        return
    translator = shape.translator(request)
    # A translator reads the usage, which never reaches the client as is.
    events = replay(request.path, lookup.body, include_usage or translator is not None)
    if translator is None:
        body = raw(events)
    else:
        body = translator.feed(events) + translator.finish()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [EVENT_STREAM, NO_CACHE, *extra]}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class StreamRecorder:
    """Keeps a copy of a streamed answer's events on their way to the client (the Responder
    records them); when the stream ends whole, the assembled answer is stored before its last
    bytes go out, so the client's next identical request finds it."""

    __slots__ = ("events", "lookup", "path")

    def __init__(self, lookup: Lookup, path: str) -> None:
        self.lookup = lookup
        self.path = path
        self.events: list[StreamEvent] = []

    async def store(self) -> None:
        answer = assemble(self.path, self.events)
        if answer is not None:
            await self.lookup.store(answer)


def settle_hit(access: Access | None, ticket: Ticket | None, lookup: Lookup) -> None:
    """A hit counts as a request, costs nothing upstream and uses no TPM."""
    if access is None or ticket is None:
        return
    try:
        payload = orjson.loads(lookup.body or b"{}")
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        payload = {}
    model = payload.get("model")
    access.settle(ticket, model if isinstance(model, str) else "", payload.get("usage"), None, True)


class Cache:
    """The stage that answers from the cache for groups that keep answers (what a request
    may do with the cache is its own to say; the `cache` body field is never forwarded)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, flow: Flow, call_next: Next) -> Awaitable[None]:
        ctx, group = flow.ctx, flow.group
        assert ctx is not None and group is not None, "the cache runs after resolve"
        field = take_field(ctx) if "cache" in ctx.payload else None
        if group.cache is None or self.pipeline.cache is None or ctx.native:
            return call_next(flow)  # a native answer is the provider's own: not kept
        return self._lookup(flow, call_next, field)

    async def _lookup(self, flow: Flow, call_next: Next, field: Any) -> None:
        ctx, group, cache = flow.ctx, flow.group, self.pipeline.cache
        assert ctx is not None and group is not None and group.cache is not None
        assert cache is not None
        # Waiting on an identical request already upstream is waiting too: watch the client.
        flow.watch = watch = DisconnectWatch(
            flow.receive, self.pipeline.clock, writer=flow.responder.writer
        )
        responder = flow.responder
        ctx.lookup = lookup = await cache.lookup(
            ctx.path,
            group.name,
            ctx.payload,
            scope_of(ctx.ticket, ctx),
            group.cache,
            mode_of(flow.scope, field),
        )
        responder.extra.append((HEADER, lookup.status))
        if lookup.body is None:
            await call_next(flow)
            return
        watch.stop()
        ctx.settled = True  # a hit is settled as one, here
        settle_hit(self.pipeline.access, ctx.ticket, lookup)
        usage = wants_usage(ctx, ctx.usage_added)
        await send_hit(responder.send, ctx, lookup, responder.extra, usage, responder.shape)

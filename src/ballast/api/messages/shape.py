"""The Anthropic Messages shape (`POST /v1/messages`), served one of two ways per deployment
(`messages: native|bridge`, native by default for `provider: anthropic`):

- native: the client's body goes to the deployment's own `/v1/messages` as it came (only the
  model name rewritten where the deployment names another, and Ballast's own fields taken
  out), with the `anthropic-version` and `anthropic-beta` headers it sent, and the answer or
  events come back untouched (signatures, redacted thinking, cache usage);
- bridge: the body becomes a chat completion (request.py) and the chat answer or stream
  becomes a Message or Anthropic's events (answer.py, stream.py); what the translation
  leaves out is named in `dropped`.

A group mixing both fails over across them before the first byte: the native request
carries its chat form (`bridge`) for the deployments that are bridged, and the stream's
translator passes Anthropic's events or translates chat ones, whichever come. The chat form
keeps the cache marks and thinking a bridged deployment's provider carries, with the plain
chat form as its own `bridge` for one that carries none (extensions.py). Keys come as
Anthropic clients send them: `x-api-key`, or `Authorization: Bearer`."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.api.messages.answer import message_body
from ballast.api.messages.errors import passthrough, render, stream_event
from ballast.api.messages.extensions import left_out
from ballast.api.messages.request import invalid, to_chat
from ballast.api.messages.stream import MessagesStream, NativeStream
from ballast.config import Deployment, ModelGroup
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import Scope, header
from ballast.pipeline.context import RequestContext
from ballast.pipeline.duplicate_keys import DuplicateKeys
from ballast.pipeline.errors import ApiError, bad_request
from ballast.pipeline.shape import Modes, Resolve, Shape, StreamTranslator
from ballast.providers import ADAPTERS

# The fields read before the body is translated or forwarded.
_DUPLICATES = DuplicateKeys(("model", "max_tokens", "stream", "fallbacks", "cache"))
_OWN = frozenset(("fallbacks", "cache"))  # Ballast's own fields: never sent upstream
# How a deployment serves Messages: natively, or bridged, carrying the extensions of the
# chat form its provider carries (extensions.py).
Way = str | frozenset[str]
NATIVE = "native"
_PLAIN: frozenset[Way] = frozenset((frozenset(),))  # no groups known: bridged, plain chat
_NATIVE_ONLY: frozenset[Way] = frozenset((NATIVE,))


def way(deployment: Deployment) -> Way:
    if deployment.messages_mode == "native":
        return NATIVE
    return ADAPTERS[deployment.provider].extensions


def _fallbacks(payload: dict[str, Any]) -> tuple[str, ...]:
    """Ballast's `fallbacks` field (it is never forwarded)."""
    given = payload.get("fallbacks")
    if given is None:
        return ()
    if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
        raise bad_request("fallbacks: Input should be a list of model names", "fallbacks")
    return tuple(given)


def _chat(
    payload: dict[str, Any],
    counting: bool,
    dropped: list[str],
    keep: frozenset[str] = frozenset(),
    kept: list[str] | None = None,
) -> dict[str, Any]:
    chat = to_chat(payload, counting, dropped, keep, kept)
    chat.pop("fallbacks", None)
    return chat


def _form(ctx: RequestContext, chat: dict[str, Any], extended: bool) -> RequestContext:
    """`ctx` in another chat form, for the deployments that take it: the same request (its
    id, its credential), with the same edits (one dict: what changes one changes both)."""
    form = RequestContext("/chat/completions", chat, orjson.dumps(chat), ctx.model, ctx.stream)
    form.request_id = ctx.request_id
    form.authorization = ctx.authorization
    form.edits = ctx.edits
    form.extended = extended
    return form


def keep_own(ctx: RequestContext) -> None:
    """Ballast's own fields of a native request stay here: they are not sent upstream."""
    for name in _OWN.intersection(ctx.payload):
        ctx.edits[name] = None


class MessagesShape(Shape):
    name = "anthropic"
    translates = True
    forwards = (b"anthropic-version", b"anthropic-beta")

    def __init__(self, resolve: Resolve | None = None) -> None:
        """`resolve`: the model groups now serving (to know their deployments' ways);
        without it every request is bridged."""
        self._ways = None if resolve is None else Modes(resolve, way)

    def parse(self, path: str, body: bytes) -> RequestContext:
        payload = _DUPLICATES.load(body)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            problem = "Field required" if model is None else "Input should be a string"
            raise invalid("model", problem)
        stream = payload.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise invalid("stream", "Input should be a valid boolean")
        ctx = RequestContext("/messages", payload, body, model, stream is True)
        ctx.fallbacks = _fallbacks(payload)
        return ctx

    def context(self, body: bytes, counting: bool) -> RequestContext:
        """The chat request for a Messages body (`counting`: a count_tokens body)."""
        return self.translated(_DUPLICATES.load(body), counting)

    def translated(self, payload: dict[str, Any], counting: bool) -> RequestContext:
        """The chat request for a Messages body already read."""
        fallbacks = _fallbacks(payload)
        chat = _chat(payload, counting, [])
        raw = orjson.dumps(chat)
        ctx = RequestContext("/chat/completions", chat, raw, chat["model"], "stream" in chat)
        ctx.fallbacks = fallbacks
        return ctx

    def bind(self, ctx: RequestContext, group: ModelGroup) -> None:
        """Native, bridged or both, now that the model group is known; bridged, in the
        chat forms its deployments take (extensions.py)."""
        payload = ctx.payload
        ways = _PLAIN if self._ways is None else self._ways.of(group, ctx.fallbacks)
        carried = () if ways == _NATIVE_ONLY else [w for w in ways if not isinstance(w, str)]
        if carried:
            dropped: list[str] = []
            kept: list[str] = []
            chat = _chat(payload, False, dropped, frozenset().union(*carried), kept)
            ctx.dropped = left_out(dropped, kept, carried)
            native = NATIVE in ways
            if native:
                form = ctx.bridge = _form(ctx, chat, bool(kept))
            else:
                form = ctx
                ctx.path, ctx.payload, ctx.raw = "/chat/completions", chat, orjson.dumps(chat)
                ctx.extended = bool(kept)
            if kept and frozenset() in carried:  # a deployment that carries none of it
                form.bridge = _form(ctx, _chat(payload, False, []), False)
            if not native:
                return
        ctx.native = True
        ctx.usage_added = True  # a Messages stream always carries its usage
        keep_own(ctx)

    def authorization(self, scope: Scope) -> bytes | None:
        key = header(scope, b"x-api-key")
        if key is not None:
            return b"Bearer " + key.strip()
        return header(scope, b"authorization")

    def answer(self, ctx: RequestContext, payload: dict[str, Any]) -> bytes | None:
        if ctx.native and payload.get("type") == "message":
            return None  # the upstream's own Message, as it came
        chat = _chat_form(ctx)
        message = message_body(
            payload, ctx.model, chat.payload.get("stop"), estimate_prompt_tokens(chat)
        )
        return orjson.dumps(message)

    def translator(self, ctx: RequestContext) -> StreamTranslator:
        if ctx.native and ctx.bridge is None:
            return NativeStream()
        chat = _chat_form(ctx)
        return MessagesStream(ctx.model, chat.payload.get("stop"), estimate_prompt_tokens(chat))

    def error(self, error: ApiError) -> tuple[int, bytes]:
        return render(error)

    def error_event(self, error: ApiError) -> bytes:
        return stream_event(error)

    def passthrough(self, status: int, body: bytes) -> tuple[int, bytes]:
        return passthrough(status, body)


def _chat_form(ctx: RequestContext) -> RequestContext:
    """The request's chat form (a native one's bridge), which a chat answer answers."""
    return ctx.bridge if ctx.native and ctx.bridge is not None else ctx


MESSAGES = MessagesShape()

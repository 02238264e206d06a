"""The Anthropic Messages shape (`POST /v1/messages`): parsed to a chat completion, answered
as a Message or as Anthropic's stream events, failing in Anthropic's error shape. Keys come
as Anthropic clients send them: `x-api-key`, or `Authorization: Bearer`."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.api.messages.answer import message_body
from ballast.api.messages.errors import passthrough, render, stream_event
from ballast.api.messages.request import to_chat
from ballast.api.messages.stream import MessagesStream
from ballast.pipeline.access import estimate_prompt_tokens
from ballast.pipeline.asgi import Scope, header
from ballast.pipeline.context import RequestContext
from ballast.pipeline.duplicate_keys import DuplicateKeys
from ballast.pipeline.errors import ApiError, bad_request
from ballast.pipeline.shape import Shape

# The fields read before the body is translated (the translation re-encodes the rest).
_DUPLICATES = DuplicateKeys(("model", "max_tokens", "stream", "fallbacks", "cache"))


def _fallbacks(chat: dict[str, Any]) -> tuple[str, ...]:
    """Ballast's `fallbacks` field, taken out of the chat body (it is never forwarded)."""
    given = chat.pop("fallbacks", None)
    if given is None:
        return ()
    if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
        raise bad_request("fallbacks: Input should be a list of model names", "fallbacks")
    return tuple(given)


class MessagesShape(Shape):
    name = "anthropic"
    translates = True

    def parse(self, path: str, body: bytes) -> RequestContext:
        return self.context(body, counting=False)

    def context(self, body: bytes, counting: bool) -> RequestContext:
        """The chat request for a Messages body (`counting`: a count_tokens body)."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise bad_request("We could not parse the JSON body of your request.") from None
        if isinstance(payload, dict):
            _DUPLICATES.check(body, payload)
        chat = to_chat(payload, counting)
        fallbacks = _fallbacks(chat)
        raw = orjson.dumps(chat)
        ctx = RequestContext("/chat/completions", chat, raw, chat["model"], "stream" in chat)
        ctx.fallbacks = fallbacks
        return ctx

    def authorization(self, scope: Scope) -> bytes | None:
        key = header(scope, b"x-api-key")
        if key is not None:
            return b"Bearer " + key.strip()
        return header(scope, b"authorization")

    def answer(self, ctx: RequestContext, payload: dict[str, Any]) -> bytes:
        message = message_body(
            payload, ctx.model, ctx.payload.get("stop"), estimate_prompt_tokens(ctx)
        )
        return orjson.dumps(message)

    def translator(self, ctx: RequestContext) -> MessagesStream:
        return MessagesStream(ctx.model, ctx.payload.get("stop"), estimate_prompt_tokens(ctx))

    def error(self, error: ApiError) -> tuple[int, bytes]:
        return render(error)

    def error_event(self, error: ApiError) -> bytes:
        return stream_event(error)

    def passthrough(self, status: int, body: bytes) -> tuple[int, bytes]:
        return passthrough(status, body)


MESSAGES = MessagesShape()

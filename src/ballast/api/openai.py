"""The OpenAI-compatible surface. The hot path reads the body once, looks only at `model`,
`stream` and `fallbacks`, and forwards the client's bytes unless something must change."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import TYPE_CHECKING, Any

import orjson

from ballast.api.asgi import (
    EVENT_STREAM,
    JSON,
    NO_CACHE,
    ClientGone,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    require_json,
    send_bytes,
    send_error,
)
from ballast.api.caching import HEADER as CACHE_HEADER
from ballast.api.caching import (
    StreamRecorder,
    mode_of,
    scope_of,
    send_hit,
    settle_hit,
    take_field,
    wants_usage,
)
from ballast.api.errors import ApiError, bad_request, from_failure, model_not_found
from ballast.cache.replay import is_complete
from ballast.resilience.failures import Failure
from ballast.routing.relay import Relay
from ballast.routing.router import ProxyRequest, Router, is_passthrough

if TYPE_CHECKING:
    from ballast.api.access import Access, Ticket
    from ballast.cache.service import Lookup, ResponseCache

log = logging.getLogger("ballast.api")

_ID_PREFIX = os.urandom(4).hex()
_ids = itertools.count(1)


def request_id(scope: Scope) -> bytes:
    given = header(scope, b"x-request-id")
    if given and len(given) <= 128:
        return given
    return f"{_ID_PREFIX}-{next(_ids)}".encode()


# Counts checked before routing (cheap; an absurd value would only fail upstream, or worse,
# make an upstream try): (name, lowest, highest).
_BOUNDED = (
    ("n", 1, 128),
    ("max_tokens", 0, 1 << 24),
    ("max_completion_tokens", 0, 1 << 24),
)


def parse_request(path: str, body: bytes) -> ProxyRequest:
    """The client's request as the router needs it; clear 400s for anything unusable."""
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
    fallbacks: tuple[str, ...] = ()
    if "fallbacks" in payload:
        given = payload.pop("fallbacks")
        if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
            raise bad_request("'fallbacks' must be a list of model names.", "fallbacks")
        fallbacks = tuple(given)
        body = orjson.dumps(payload)
    return ProxyRequest(path, payload, body, model, stream, fallbacks=fallbacks)


def ask_for_usage(request: ProxyRequest) -> bool:
    """Streams must report usage for accounting. When the client did not ask for it, ask the
    upstream anyway and return True: the relay then strips the usage chunk."""
    options = request.payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return False
    request.payload["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    request.raw = orjson.dumps(request.payload)
    return True


class OpenAIHandlers:
    def __init__(self, router: Router, max_body_bytes: int, body_timeout: float = 30.0) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.access: Access | None = None  # set once state is ready at start-up
        self.cache: ResponseCache | None = None  # likewise; used by groups with `cache`

    async def proxy(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        rid = request_id(scope)
        extra = [(b"x-request-id", rid)]
        watch: DisconnectWatch | None = None
        access = self.access
        ticket: Ticket | None = None
        lookup: Lookup | None = None
        settled = False
        strip_usage = False
        try:
            require_json(scope)
            body = await read_body(scope, receive, self.max_body_bytes, self.body_timeout)
            request = parse_request(path, body)
            request.request_id = rid.decode("latin-1")
            request.authorization = header(scope, b"authorization")
            scope["ballast.request"] = request  # read by the request log and metrics
            group = self.router.resolve(request.model)
            if group is None:
                raise model_not_found(request.model)
            cache_field = take_field(request) if "cache" in request.payload else None
            if access is not None:
                ticket = await access.admit(scope, request)
                if ticket is not None:
                    if ticket.lease is not None:
                        extra.extend(ticket.lease.headers)
                    strip_usage = request.stream and ask_for_usage(request)
            watch = DisconnectWatch(receive)
            if group.cache is not None and self.cache is not None:
                lookup = await self.cache.lookup(
                    request.path,
                    group.name,
                    request.payload,
                    scope_of(ticket, request),
                    group.cache,
                    mode_of(scope, cache_field),
                )
                extra.append((CACHE_HEADER, lookup.status))
                if lookup.body is not None:  # a hit: nothing goes upstream
                    watch.stop()
                    settled = True
                    settle_hit(access, ticket, lookup)
                    await send_hit(send, request, lookup, extra, wants_usage(request, strip_usage))
                    return
            if request.stream:
                recorder = None
                if lookup is not None:  # usage is asked for to be kept with the answer
                    hide = strip_usage if ticket is not None else ask_for_usage(request)
                    recorder = StreamRecorder(send, lookup, request.path, hide)
                relay = await self._stream(
                    request,
                    group,
                    send if recorder is None else recorder.send,
                    extra,
                    watch,
                    ticket is not None and strip_usage and recorder is None,
                )
                if access is not None and relay is not None:
                    settled = True
                    access.settle(
                        ticket,
                        relay.model or request.model,
                        relay.stream.state.usage,
                        relay.deployment,
                    )
            else:
                reply = await self.router.complete(request, group)
                watch.stop()
                if access is not None:
                    settled = True
                    payload = reply.payload if isinstance(reply.payload, dict) else {}
                    model = payload.get("model")
                    access.settle(
                        ticket,
                        model if isinstance(model, str) else request.model,
                        payload.get("usage"),
                        None,
                    )
                if lookup is not None and reply.status == 200:
                    if is_complete(request.path, reply.payload):
                        await lookup.store(reply.body)
                # The body parsed as a JSON object, whatever the upstream called it.
                headers = [h for h in reply.headers if h[0] != b"content-type"]
                headers.append(JSON)
                headers.extend(extra)
                await send_bytes(send, reply.status, headers, reply.body)
        except ApiError as error:
            if watch is not None:
                watch.stop()
            await send_error(send, error, extra)
        except Failure as failure:
            if watch is not None:
                watch.stop()
            if is_passthrough(failure):
                # The upstream refused the request itself (a stream that never started):
                # the client gets that answer unchanged, as for a non-streamed request.
                headers = list(failure.headers)
                if not any(k == b"content-type" for k, _ in headers):
                    headers.append(JSON)
                headers.extend(extra)
                await send_bytes(send, failure.status or 502, headers, failure.body or b"")
                return
            await send_error(send, from_failure(failure), extra)
        except ClientGone:
            return
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.info("client went away; upstream request %s dropped", rid.decode("latin-1"))
        finally:
            if ticket is not None and not settled and access is not None:
                access.settle(ticket, "", None, None)  # frees the parallel slot
            if lookup is not None:
                lookup.done()  # identical requests waiting on this one go on without it

    async def _stream(
        self,
        request: ProxyRequest,
        group: Any,
        send: Send,
        extra: list[tuple[bytes, bytes]],
        watch: DisconnectWatch,
        strip_usage: bool = False,
    ) -> Relay:
        target, stream, held, attempted = await self.router.open(request, group)
        relay = Relay(self.router, request, group, target, stream, held, attempted)
        relay.strip_usage = strip_usage
        try:
            headers = [EVENT_STREAM, NO_CACHE, (b"x-ballast-deployment", target.id.encode())]
            headers.extend(extra)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in relay.events():
                if relay.ending:  # the last piece ends the response with it: one send less
                    watch.stop()
                await send(
                    {"type": "http.response.body", "body": chunk, "more_body": not relay.ending}
                )
            if not relay.ending:
                watch.stop()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            relay.close()
        return relay

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "ballast"}
            for name in self.router.public_models()
        ]
        body = orjson.dumps({"object": "list", "data": data})
        await send_bytes(send, 200, [JSON], body)

"""The simulator's HTTP surface: OpenAI-compatible endpoints that misbehave on request.

Behaviour per request, first match wins: the ``x-sim-behaviour`` header, the runtime
rule for the request's model (``PUT /sim/behaviour``), the ``*`` rule, the app default.
"""

from __future__ import annotations

import gzip
import math
import random
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from ballast.sim.admin import add_admin_routes, invalid_request, json_response
from ballast.sim.answer import (
    Answer,
    billed,
    chat_answer,
    completion_answer,
    count_words,
    prompt_texts,
    tool_result_last,
    wants_json,
)
from ballast.sim.anthropic import count_tokens as anthropic_count_tokens
from ballast.sim.anthropic import messages as anthropic_messages
from ballast.sim.azure import deployment_of as azure_deployment
from ballast.sim.azure import refusal as azure_refusal
from ballast.sim.bedrock import add_bedrock_routes
from ballast.sim.behaviour import Behaviour
from ballast.sim.bodies import (
    DONE_EVENT,
    MALFORMED_EVENT,
    Ids,
    chat_body,
    completion_body,
    embeddings_body,
    fault_error,
    stream_events,
)
from ballast.sim.conn import close as _close
from ballast.sim.conn import pause as _pause
from ballast.sim.conn import reset as _reset
from ballast.sim.gemini import add_gemini_routes
from ballast.sim.jobs import add_job_routes
from ballast.sim.responses import BadInput, max_output_tokens, messages_of, response_body
from ballast.sim.responses import stream_events as response_events
from ballast.sim.responses import usage_of as response_usage
from ballast.sim.state import SIM_STATE, SimState, seen_headers

BEHAVIOUR_HEADER = "x-sim-behaviour"
ERROR_OUTCOMES = frozenset({"429", "500", "503", "context_length", "content_filter", "409", "401"})
# Faults that only change a stream; a non-stream request under them is answered normally.
STREAM_ONLY = frozenset({"no_done", "error_event"})
ERROR_EVENT = (
    b'data: {"error": {"message": "The server is overloaded (sim).", "type": "server_error",'
    b' "param": null, "code": "overloaded"}}\n\n'
)
# The send times of a stream's first tokens are logged, so a test can tell what a relay adds.
MAX_SEND_TIMES = 256
MAX_BODY_BYTES = 64 * 1024 * 1024
HTML_PAGE = (
    b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway"
    b"</h1></center><hr><center>nginx</center></body></html>\n"
)


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _BadRequest(f"{key} must be a non-negative integer (sim)", key)
        return value
    return None


def _embedding_texts(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return [" ".join(str(v) for v in value)]
        return prompt_texts(value)
    raise _BadRequest("'input' must be a string or a non-empty array (sim)", "input")


async def _read_body(request: web.Request, default_model: str | None = None) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise _BadRequest("We could not parse the JSON body of your request (sim).") from None
    if not isinstance(body, dict):
        raise _BadRequest("The request body must be a JSON object (sim).")
    if default_model is not None and not body.get("model"):
        body["model"] = default_model
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest("You must provide a model parameter (sim).", "model")
    return body


def _answer_for(kind: str, body: dict[str, Any], tokens: int) -> Answer:
    if kind == "responses":
        try:
            cap = max_output_tokens(body)
            return chat_answer(messages_of(body), tokens, cap)
        except BadInput as exc:
            raise _BadRequest(str(exc), exc.param) from None
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' must be a non-empty array (sim)", "messages")
        return chat_answer(messages, tokens, _max_tokens(body))
    return completion_answer(body.get("prompt", ""), tokens, _max_tokens(body))


async def _endpoint(
    request: web.Request, kind: str, default_model: str | None = None
) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    headers = seen_headers(request, ("authorization", "api-key"), ("traceparent", "tracestate"))
    spec = request.headers.get(BEHAVIOUR_HEADER)
    model: str | None = None
    answer: Answer | None = None
    try:
        body = await _read_body(request, default_model)
        model = str(body["model"])
        try:
            rule = state.select(model, spec)
        except ValueError as exc:
            raise _BadRequest(
                f"invalid {BEHAVIOUR_HEADER}: {exc}", None, "invalid_behaviour"
            ) from None
        behaviour = rule.behaviour
        if kind != "embeddings":
            answer = billed(_answer_for(kind, body, behaviour.tokens), behaviour)
        texts = _embedding_texts(body) if kind == "embeddings" else []
    except _BadRequest as exc:
        state.record(
            model=model, path=request.path, behaviour=spec, outcome="bad_request",
            stream=False, prefill=False, headers=headers,
        )  # fmt: skip
        return invalid_request(exc.message, exc.param, exc.code)
    except ConnectionError:  # the client went away while sending the body
        return web.Response()

    stream = kind != "embeddings" and body.get("stream") is True
    outcome = behaviour.name
    if behaviour.is_error_mode and not rule.should_fail(model):
        outcome = "ok"
    elif outcome in STREAM_ONLY and not stream:
        outcome = "ok"
    entry = state.record(
        model=model,
        path=request.path,
        behaviour=behaviour.spec,
        outcome=outcome,
        stream=stream,
        prefill=answer.prefill if answer else False,
        headers=headers,
    )

    if outcome == "html":
        return web.Response(status=behaviour.status, body=HTML_PAGE, content_type="text/html")
    if outcome in ERROR_OUTCOMES:
        prompt_tokens = answer.prompt_tokens if answer else count_words(texts)
        auth = request.headers.get("authorization")
        status, error, extra = fault_error(behaviour, prompt_tokens, auth)
        return json_response(error, status, extra)
    if outcome == "reset":
        _reset(request)
        return web.Response()
    if outcome == "hang":
        await _pause(request, math.inf)
        entry["disconnected"] = True
        return web.Response()
    # `latency` is the time an answer takes to start: before a whole answer, and before a
    # stream's headers (a gateway may ask for a stream where its client did not).
    before = behaviour.latency + (behaviour.first_token_delay if outcome == "slow_first" else 0.0)
    if not stream and outcome == "stall":
        before += behaviour.seconds
    if before > 0 and not await _pause(request, before):
        entry["disconnected"] = True
        return web.Response()

    ids = Ids(state.next_id(), int(time.time()), model, state.name)
    # A tool-calling model answers in text once its tool's result is back.
    shape = "text" if behaviour.shape == "tool" and tool_result_last(body) else behaviour.shape
    if shape == "text" and wants_json(body):
        shape = "json"  # asked for JSON output: the answer is the object {"q": ...}
    if kind == "embeddings":
        encoding = "base64" if body.get("encoding_format") == "base64" else "float"
        return await _plain(request, entry, outcome, embeddings_body(ids, texts, encoding), 0)
    assert answer is not None
    if kind != "completions":  # the prompt as OpenAI's cache reads it
        prompt = messages_of(body) if kind == "responses" else body["messages"]
        answer = state.prompt_cache.reused(prompt, body, answer)
    entry["usage"] = response_usage(answer) if kind == "responses" else answer.usage()
    if kind == "responses":
        if not stream:
            full = response_body(ids, body, answer, shape)
            return await _plain(request, entry, outcome, full, answer.completion_tokens)
        events, first = response_events(ids, body, answer, shape)
        return await _stream(request, entry, behaviour, outcome, events, answer, first, b"")
    if not stream:
        full = chat_body(ids, answer, shape) if kind == "chat" else completion_body(ids, answer)
        return await _plain(request, entry, outcome, full, answer.completion_tokens)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    events = stream_events(
        ids, answer, chat=kind == "chat", include_usage=include_usage, shape=shape
    )
    return await _stream(request, entry, behaviour, outcome, events, answer, int(kind == "chat"))


async def _plain(
    request: web.Request, entry: dict[str, Any], outcome: str, body: dict[str, Any], tokens: int
) -> web.StreamResponse:
    data = orjson.dumps(body)
    if outcome == "malformed":
        data = b"{not json"
    if outcome == "gzip_truncated":
        return _truncated_gzip(entry, data, "application/json")
    if outcome == "wrong_type":
        entry["tokens"] = tokens
        return web.Response(body=data, content_type="text/html")
    if outcome != "cut":
        entry["tokens"] = tokens
        return web.Response(body=data, content_type="application/json")
    # cut: promise the whole body, send half of it, close the connection.
    response = web.StreamResponse()
    response.content_type = "application/json"
    response.content_length = len(data)
    try:
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
    except ConnectionError:
        entry["disconnected"] = True
    _close(request)
    return response


def _truncated_gzip(entry: dict[str, Any], data: bytes, content_type: str) -> web.Response:
    """A complete HTTP message whose gzip-encoded body stops halfway through."""
    packed = gzip.compress(data)
    entry["tokens"] = 0
    response = web.Response(body=packed[: len(packed) // 2], content_type=content_type)
    response.headers["Content-Encoding"] = "gzip"
    return response


async def _stream(
    request: web.Request,
    entry: dict[str, Any],
    behaviour: Behaviour,
    outcome: str,
    events: list[bytes],
    answer: Answer,
    first_token: int,
    done: bytes = DONE_EVENT,
) -> web.StreamResponse:
    """`events[first_token]` is the first that carries a token; `done` ends the stream."""
    if outcome in ("gzip_truncated", "wrong_type"):
        whole = b"".join([*events, done])
        if outcome == "gzip_truncated":
            return _truncated_gzip(entry, whole, "text/event-stream")
        return web.Response(body=whole, content_type="application/json")
    fault_at = first_token + min(behaviour.after, len(answer.pieces))
    cut_at = fault_at if outcome == "cut" else -1
    stall_at = fault_at if outcome == "stall" else -1
    response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
    response.content_type = "text/event-stream"
    if outcome == "no_done":
        response.force_close()
    try:
        await response.prepare(request)
        for index, event in enumerate(events):
            if index == cut_at:
                _close(request)
                return response
            if outcome == "error_event" and index == fault_at:
                await response.write(ERROR_EVENT)
                await response.write_eof()
                return response
            wait = behaviour.first_token_delay if index == 0 else behaviour.delay
            if index == 0 and behaviour.tail_p and random.random() < behaviour.tail_p:
                wait += behaviour.tail_delay
            if outcome == "slow_first":
                wait = 0.0 if index == 0 else behaviour.delay
            if index == stall_at:
                wait += behaviour.seconds
            if wait > 0 and not await _pause(request, wait):
                raise ConnectionResetError("client went away")
            if outcome == "malformed" and index == behaviour.at:
                event = MALFORMED_EVENT
            await response.write(event)
            if first_token <= index < first_token + len(answer.pieces):
                entry["tokens"] += 1
                sent = entry.setdefault("sent", [])
                if len(sent) < MAX_SEND_TIMES:
                    sent.append(time.time())  # wall clock: a client can compare its own
        if outcome != "no_done":
            if behaviour.delay > 0 and not await _pause(request, behaviour.delay):
                raise ConnectionResetError("client went away")
            if done:
                await response.write(done)
        await response.write_eof()
    except ConnectionError:
        entry["disconnected"] = True
    return response


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _endpoint(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _endpoint(request, "completions")


async def _responses(request: web.Request) -> web.StreamResponse:
    return await _endpoint(request, "responses")


async def _embeddings(request: web.Request) -> web.StreamResponse:
    return await _endpoint(request, "embeddings")


_KINDS = {"chat/completions": "chat", "completions": "completions", "embeddings": "embeddings"}


async def _azure_classic(request: web.Request) -> web.StreamResponse:
    refused = azure_refusal(request, classic=True)
    if refused is not None:
        return refused
    kind = _KINDS[request.match_info["kind"]]
    return await _endpoint(request, kind, azure_deployment(request))


async def _azure_v1(request: web.Request) -> web.StreamResponse:
    refused = azure_refusal(request, classic=False)
    if refused is not None:
        return refused
    return await _endpoint(request, _KINDS[request.match_info["kind"]])


def _model_object(state: SimState, model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": state.name}


async def _models(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    # A key the upstream refuses is refused here too, as real providers do; faults that
    # are about answering (5xx, 429, stalls) leave the model list alone.
    rule = state.select("*", request.headers.get(BEHAVIOUR_HEADER))
    if rule.behaviour.name == "401":
        status, error, extra = fault_error(rule.behaviour, 0, request.headers.get("authorization"))
        return json_response(error, status, extra)
    data = [_model_object(state, m) for m in state.model_ids()]
    return json_response({"object": "list", "data": data})


async def _model(request: web.Request) -> web.Response:
    return json_response(_model_object(request.app[SIM_STATE], request.match_info["model"]))


async def _health(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "name": request.app[SIM_STATE].name})


async def _on_shutdown(app: web.Application) -> None:
    app[SIM_STATE].closing = True


async def _name_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["x-sim-name"] = request.app[SIM_STATE].name
    # What OpenAI sends with every answer: its own request id, the organisation's quota
    # and the time it took. A gateway should keep the first two to itself.
    response.headers["x-request-id"] = f"req_{uuid.uuid4().hex}"
    response.headers["x-ratelimit-limit-requests"] = "10000"
    response.headers["x-ratelimit-remaining-requests"] = "9999"
    response.headers["openai-processing-ms"] = "1"


def create_app(
    default: str = "ok", *, name: str = "sim", models: tuple[str, ...] = ("sim-model",)
) -> web.Application:
    """The simulator app. ``default`` is the behaviour spec used when nothing else matches
    (an invalid spec raises ValueError); ``name`` is reported in ``x-sim-name`` and
    ``system_fingerprint``; ``models`` are listed by ``GET /v1/models``.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SIM_STATE] = SimState(default, name, tuple(models))
    app.on_response_prepare.append(_name_header)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_post("/v1/responses", _responses)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_get("/health", _health)
    app.router.add_post("/v1/messages", anthropic_messages)
    app.router.add_post("/v1/messages/count_tokens", anthropic_count_tokens)
    kinds = "{kind:chat/completions|completions|embeddings}"
    app.router.add_post("/openai/deployments/{deployment}/" + kinds, _azure_classic)
    app.router.add_post("/openai/v1/" + kinds, _azure_v1)
    add_admin_routes(app)
    add_job_routes(app)
    add_gemini_routes(app)
    add_bedrock_routes(app)
    return app

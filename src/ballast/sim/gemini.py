"""The Gemini wire of the simulator: AI Studio (`/v1beta/models/{model}:generateContent` and
`:streamGenerateContent?alt=sse`, also under `/v1/`; the key in `x-goog-api-key` or `?key=`)
and Vertex AI (the same bodies under
`/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...`, with a bearer token).
Errors are Google's `{"error": {code, message, status}}`; a content filter is a prompt
blocked for safety, answered with 200 as Gemini does."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ballast.sim.answer import Answer
from ballast.sim.behaviour import Behaviour
from ballast.sim.bodies import TOOL_NAME, Ids, format_retry_after
from ballast.sim.native import BadCall, NativeCall, bearer, handle
from ballast.sim.state import SIM_STATE

_ERRORS = {
    "429": (429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota). (sim)"),
    "500": (500, "INTERNAL", "An internal error has occurred. (sim)"),
    "503": (503, "UNAVAILABLE", "The model is overloaded. Please try again later. (sim)"),
    "409": (409, "ABORTED", "The operation was aborted. (sim)"),
    "401": (401, "UNAUTHENTICATED", "Request had invalid authentication credentials. (sim)"),
}
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS"}


def _error(code: int, status: str, message: str, details: list[Any] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return orjson.dumps({"error": error})


class GeminiWire:
    stream_type = "text/event-stream"

    def error(self, behaviour: Behaviour, answer: Answer) -> tuple[int, bytes, dict[str, str]]:
        if behaviour.name == "context_length":
            message = (
                f"The input token count ({max(answer.prompt_tokens, 9)}) exceeds the maximum "
                "number of tokens allowed (8). (sim)"
            )
            return 400, _error(400, "INVALID_ARGUMENT", message), {}
        code, status, message = _ERRORS[behaviour.name]
        headers: dict[str, str] = {}
        details = None
        if behaviour.name == "429" and behaviour.retry_after is not None:
            headers["Retry-After"] = format_retry_after(behaviour.retry_after)
            delay = f"{format_retry_after(behaviour.retry_after)}s"
            details = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]
        return code, _error(code, status, message, details), headers

    def bad_request(self, message: str) -> tuple[int, bytes, dict[str, str]]:
        return 400, _error(400, "INVALID_ARGUMENT", f"{message} (sim)"), {}

    def whole(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> bytes:
        if behaviour.name == "content_filter":
            return orjson.dumps(_blocked(ids, answer))
        parts = _parts(answer, behaviour.shape, answer.text)
        return orjson.dumps(_response(ids, answer, parts, answer.completion_tokens, True))

    def events(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> list[bytes]:
        if behaviour.name == "content_filter":
            return [_sse(_blocked(ids, answer))]
        if behaviour.shape == "tool":
            pieces = [_parts(answer, "tool", answer.text)]
        else:
            pieces = [[{"text": piece}] for piece in answer.pieces]
        events = [_sse(_response(ids, answer, p, i + 1, False)) for i, p in enumerate(pieces)]
        end = _response(ids, answer, [{"text": ""}], answer.completion_tokens, True)
        return [*events, _sse(end)]

    def usage(self, answer: Answer) -> dict[str, Any]:
        return _usage(answer, answer.completion_tokens)

    def opening(self, behaviour: Behaviour) -> int:
        return 0

    def closing(self, behaviour: Behaviour) -> int:
        return 1

    def malformed(self) -> bytes:
        return b"data: {not json\r\n\r\n"

    def corrupt(self, event: bytes) -> bytes:
        return event  # an SSE wire has no checksum to break

    def error_event(self) -> bytes:
        message = "The model is overloaded. Please try again later. (sim)"
        return b"data: " + _error(503, "UNAVAILABLE", message) + b"\r\n\r\n"


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\r\n\r\n"


def _parts(answer: Answer, shape: str, text: str) -> list[dict[str, Any]]:
    if shape == "tool":
        return [{"functionCall": {"name": TOOL_NAME, "args": {"q": text}}}]
    return [{"text": text}]


def _response(
    ids: Ids, answer: Answer, parts: list[dict[str, Any]], emitted: int, last: bool
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if last:
        candidate["finishReason"] = _FINISH.get(answer.finish_reason, "STOP")
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(answer, emitted),
        "modelVersion": ids.model,
        "responseId": f"sim-{ids.number}",
    }


def _usage(answer: Answer, emitted: int) -> dict[str, int]:
    """Gemini's usage: `promptTokenCount` holds what a cache served
    (`cachedContentTokenCount`); the thoughts, billed as output, are counted apart from the
    candidates. Writes to a cache are not reported (Gemini bills a cache's storage)."""
    usage = {
        "promptTokenCount": answer.prompt_tokens,
        "candidatesTokenCount": emitted,
        "totalTokenCount": answer.prompt_tokens + emitted + answer.thinking,
    }
    if answer.cached:
        usage["cachedContentTokenCount"] = answer.cached
    if answer.thinking:
        usage["thoughtsTokenCount"] = answer.thinking
    return usage


def _blocked(ids: Ids, answer: Answer) -> dict[str, Any]:
    usage = {"promptTokenCount": answer.prompt_tokens, "totalTokenCount": answer.prompt_tokens}
    return {
        "promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": usage,
        "modelVersion": ids.model,
    }


WIRE = GeminiWire()


def _call(body: Any, model: str, method: str, token: str | None) -> NativeCall | BadCall:
    if method not in ("generateContent", "streamGenerateContent"):
        return BadCall(f"unknown method {method!r}")
    if not isinstance(body, dict):
        return BadCall("the request body must be a JSON object")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return BadCall("contents must be a non-empty array")
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if isinstance(system, dict):
        messages.append({"role": "system", "content": _text(system)})
    for content in contents:
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return BadCall("each content needs a role of user or model")
        if not isinstance(content.get("parts"), list) or not content["parts"]:
            return BadCall("each content needs a non-empty parts array")
        role = "assistant" if content["role"] == "model" else "user"
        messages.append({"role": role, "content": _text(content)})
    config = body.get("generationConfig") or {}
    limit = config.get("maxOutputTokens") if isinstance(config, dict) else None
    stream = method == "streamGenerateContent"
    return NativeCall(model, messages, limit if isinstance(limit, int) else None, stream, token)


def _text(content: dict[str, Any]) -> str:
    texts = []
    for part in content.get("parts") or ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and "functionResponse" in part:
            texts.append(orjson.dumps(part["functionResponse"]).decode())
    return "".join(texts)


async def _serve(request: web.Request, token: str | None) -> web.StreamResponse:
    model, _, method = request.match_info["target"].partition(":")
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return await handle(request, WIRE, BadCall("the request body is not JSON"))
    if method == "streamGenerateContent" and request.query.get("alt") != "sse":
        return await handle(request, WIRE, BadCall("this simulator streams with alt=sse only"))
    return await handle(request, WIRE, _call(body, model, method, token))


async def _studio(request: web.Request) -> web.StreamResponse:
    key = request.headers.get("x-goog-api-key") or request.query.get("key")
    if not key:
        message = "Method doesn't allow unregistered callers: give an API key. (sim)"
        return web.Response(status=403, body=_error(403, "PERMISSION_DENIED", message),
                            content_type="application/json")  # fmt: skip
    return await _serve(request, key)


async def _vertex(request: web.Request) -> web.StreamResponse:
    token = bearer(request)
    if token is None:
        message = "Request is missing required authentication credential. (sim)"
        return web.Response(status=401, body=_error(401, "UNAUTHENTICATED", message),
                            content_type="application/json")  # fmt: skip
    return await _serve(request, token)


async def _token(request: web.Request) -> web.Response:
    """An OAuth2 token endpoint (a service account's `token_uri` may point here): each call
    issues a new access token, so a renewal is visible in the attempt log."""
    form = await request.post()
    if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
        body = orjson.dumps({"error": "unsupported_grant_type"})
        return web.Response(status=400, body=body, content_type="application/json")
    token = f"ya29.sim-{request.app[SIM_STATE].next_id()}"
    body = orjson.dumps({"access_token": token, "expires_in": 3600, "token_type": "Bearer"})
    return web.Response(body=body, content_type="application/json")


def add_gemini_routes(app: web.Application) -> None:
    app.router.add_post("/token", _token)
    for version in ("v1beta", "v1"):  # AI Studio serves both versions of the API
        app.router.add_post(f"/{version}/models/{{target}}", _studio)
    vertex = "/projects/{project}/locations/{location}/publishers/google/models/{target}"
    for version in ("v1", "v1beta1"):
        app.router.add_post(f"/{version}{vertex}", _vertex)

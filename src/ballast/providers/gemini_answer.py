"""Gemini answers, stream chunks and errors said in the chat-completion wire.

A `streamGenerateContent?alt=sse` stream is a series of whole GenerateContentResponse
objects: each holds the next text, whole function calls, and the usage so far; the finish
reason arrives on the last one. A prompt that was blocked has no candidates at all, which is
a content refusal; a candidate stopped for safety ends with `content_filter`."""

from __future__ import annotations

import re
from typing import Any

import orjson

import ballast.providers.chat_shapes as cs
from ballast.resilience.failures import (
    BAD_RESPONSE,
    CLIENT_ERROR,
    CONTENT_FILTER,
    CONTEXT_LENGTH,
    RATE_LIMITED,
    SERVER_ERROR,
    UPSTREAM_AUTH,
    Failure,
    Kind,
)
from ballast.stream.usage import Usage, chat_usage

Ids = tuple[str, int, str]

_FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_CONTEXT_WORDING = re.compile(
    r"exceeds the maximum number of tokens|input token count|context (window|length)|too long",
    re.IGNORECASE,
)
_BY_STATUS = {
    "RESOURCE_EXHAUSTED": RATE_LIMITED,
    "UNAVAILABLE": SERVER_ERROR,
    "INTERNAL": SERVER_ERROR,
    "DEADLINE_EXCEEDED": SERVER_ERROR,
    "UNAUTHENTICATED": UPSTREAM_AUTH,
    "PERMISSION_DENIED": UPSTREAM_AUTH,
}


def whole(data: Any, ids: Ids) -> dict[str, Any]:
    """A whole `generateContent` answer as a `chat.completion`."""
    candidate = _candidate(data)
    text, calls = _content(candidate, 0)
    finish = _finish(candidate, bool(calls))
    return cs.answer(ids, text if text or not calls else None, calls, finish, _usage(data))


class GeminiStream:
    """Turns stream chunks (decoded JSON objects) into chat chunks, one state per stream."""

    __slots__ = ("_calls", "_finished", "_ids", "_started", "_usage")

    def __init__(self, ids: Ids) -> None:
        self._ids = ids
        self._started = False
        self._calls = 0
        self._finished = False
        self._usage: dict[str, Any] | None = None

    def feed(self, data: Any) -> list[dict[str, Any]]:
        candidate = _candidate(data)
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out.append(cs.chunk(self._ids, {"role": "assistant", "content": ""}))
        self._usage = _usage(data) or self._usage
        text, calls = _content(candidate, self._calls)
        if text:
            out.append(cs.chunk(self._ids, {"content": text}))
        if calls:
            deltas = [{"index": self._calls + i, **call} for i, call in enumerate(calls)]
            self._calls += len(calls)
            out.append(cs.chunk(self._ids, {"tool_calls": deltas}))
        if candidate.get("finishReason") and not self._finished:
            self._finished = True
            out.append(cs.chunk(self._ids, {}, _finish(candidate, self._calls > 0)))
        return out

    @property
    def finished(self) -> bool:
        return self._finished

    def end(self, include_usage: bool) -> list[dict[str, Any]]:
        """The usage chunk that closes a finished stream, when the client asked for one. A
        stream that ended unfinished owes nothing: the transport reports it as a cut."""
        if not self._finished:
            return []
        if include_usage and self._usage is not None:
            return [cs.usage_chunk(self._ids, self._usage)]
        return []


def _candidate(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise cs.failure(BAD_RESPONSE, "Gemini answered something that is not an object")
    if isinstance(data.get("error"), dict):
        code = cs.count(data["error"].get("code"))
        raise error_failure(code if 400 <= code < 600 else 500, data)
    candidates = cs.seq(data.get("candidates"))
    if not candidates:
        reason = cs.obj(data.get("promptFeedback")).get("blockReason")
        if reason:
            raise cs.failure(CONTENT_FILTER, f"Gemini blocked the prompt ({reason})")
        raise cs.failure(BAD_RESPONSE, "Gemini answered without a candidate")
    first = candidates[0]
    if not isinstance(first, dict):
        raise cs.failure(BAD_RESPONSE, "Gemini answered a candidate that is not an object")
    return first


def _content(candidate: dict[str, Any], first_call: int) -> tuple[str, list[dict[str, Any]]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in cs.seq(cs.obj(candidate.get("content")).get("parts")):
        if not isinstance(part, dict) or part.get("thought"):
            continue  # thought summaries are not the answer
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, dict):
            ident = str(call.get("id") or f"call_{first_call + len(calls)}")
            calls.append(cs.tool_call(ident, str(call.get("name", "")), call.get("args")))
    return "".join(texts), calls


def _finish(candidate: dict[str, Any], called: bool) -> str:
    reason = _FINISH.get(str(candidate.get("finishReason", "STOP")), "stop")
    return "tool_calls" if called and reason == "stop" else reason


def _usage(data: dict[str, Any]) -> dict[str, Any] | None:
    """Gemini's usage as chat's: `promptTokenCount` holds the tokens read from a cache
    (`cachedContentTokenCount`); the thoughts (`thoughtsTokenCount`), billed as output but
    counted apart from `candidatesTokenCount`, join the completion as its reasoning."""
    meta = data.get("usageMetadata")
    if not isinstance(meta, dict) or "promptTokenCount" not in meta:
        return None
    prompt = cs.count(meta["promptTokenCount"])
    thoughts = cs.count(meta.get("thoughtsTokenCount"))
    completion = cs.count(meta.get("candidatesTokenCount")) + thoughts
    cached = min(cs.count(meta.get("cachedContentTokenCount")), prompt)
    return chat_usage(Usage(prompt, completion, cached, reasoning=thoughts))


def error_kind(status: int, error: dict[str, Any]) -> Kind:
    """The taxonomy's kind for a Gemini error (`{"error": {code, message, status}}`)."""
    known = _BY_STATUS.get(str(error.get("status", "")))
    if known is not None:
        return known
    if status == 429:
        return RATE_LIMITED
    if status in (401, 403):
        return UPSTREAM_AUTH
    if status >= 500:
        return SERVER_ERROR
    if _CONTEXT_WORDING.search(str(error.get("message", ""))):
        return CONTEXT_LENGTH
    return CLIENT_ERROR


def error_failure(status: int, data: Any, retry_after: float | None = None) -> Failure:
    """A failure for a Gemini error answer; `retryDelay` in its RetryInfo stands in for a
    missing Retry-After header."""
    error = data.get("error") if isinstance(data, dict) else None
    error = error if isinstance(error, dict) else {}
    kind = error_kind(status, error)
    message = str(error.get("message") or f"Gemini answered {status}")[:500]
    return cs.failure(kind, message, status, retry_after or _retry_delay(error))


def parse_error(status: int, body: bytes, retry_after: float | None = None) -> Failure:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    return error_failure(status, data, retry_after)


def _retry_delay(error: dict[str, Any]) -> float | None:
    for detail in cs.seq(error.get("details")):
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return float(delay[:-1])
            except ValueError:
                return None
    return None

"""OpenAI-compatible JSON bodies (answers, stream chunks, errors) built by the simulator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from ballast.sim.answer import Answer, embedding, embedding_base64
from ballast.sim.behaviour import Behaviour

DONE_EVENT = b"data: [DONE]\n\n"
MALFORMED_EVENT = b"data: {not json\n\n"


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def error_body(
    message: str, type_: str | None, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class Ids:
    """Identity of one response: id prefix, creation time, model and sim name."""

    def __init__(self, number: int, created: int, model: str, name: str) -> None:
        self.number = number
        self.created = created
        self.model = model
        self.name = name

    def head(self, prefix: str, object_: str) -> dict[str, Any]:
        return {
            "id": f"{prefix}-sim-{self.number}",
            "object": object_,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"sim:{self.name}",
        }


TOOL_NAME = "lookup"


def tool_arguments(pieces: Sequence[str]) -> list[str]:
    """A tool call's arguments, streamed one answer token at a time: `{"q": "tok0 ..."}`."""
    if not pieces:
        return ['{"q": ""}']
    out = list(pieces)
    out[0] = '{"q": "' + out[0]
    out[-1] = out[-1] + '"}'
    return out


def tool_call_id(ids: Ids) -> str:
    return f"call_sim_{ids.number}"


def chat_body(ids: Ids, answer: Answer, shape: str = "text") -> dict[str, Any]:
    body = ids.head("chatcmpl", "chat.completion")
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
    finish = answer.finish_reason
    if shape == "tool":
        message["content"] = None
        arguments = "".join(tool_arguments(answer.pieces))
        message["tool_calls"] = [
            {
                "id": tool_call_id(ids),
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": arguments},
            }
        ]
        finish = "tool_calls" if finish == "stop" else finish
    elif shape == "reasoning":
        message["content"] = ""
        message["reasoning_content"] = answer.text
    elif shape == "json":
        message["content"] = "".join(tool_arguments(answer.pieces))
    body["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]
    body["usage"] = answer.usage()
    return body


def completion_body(ids: Ids, answer: Answer) -> dict[str, Any]:
    body = ids.head("cmpl", "text_completion")
    body["choices"] = [
        {"index": 0, "text": answer.text, "logprobs": None, "finish_reason": answer.finish_reason}
    ]
    body["usage"] = answer.usage()
    return body


def embeddings_body(ids: Ids, texts: Sequence[str], encoding: str) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for index, text in enumerate(texts):
        vector = embedding(text)
        value: Any = embedding_base64(vector) if encoding == "base64" else vector
        data.append({"object": "embedding", "index": index, "embedding": value})
    words = max(1, sum(len(t.split()) for t in texts))
    return {
        "object": "list",
        "data": data,
        "model": ids.model,
        "usage": {"prompt_tokens": words, "total_tokens": words},
    }


def stream_events(
    ids: Ids, answer: Answer, *, chat: bool, include_usage: bool, shape: str = "text"
) -> list[bytes]:
    """Every data event of a stream except the final ``[DONE]``.

    Chat: a role chunk, one chunk per token, the finish chunk, then the usage chunk when
    asked for. Completions: one chunk per token, the finish chunk, the usage chunk. A chat
    answer's tokens are text, a tool call's arguments (the first chunk names the tool), or
    reasoning, by `shape` (`json`: text that is the JSON object `{"q": ...}`).
    """
    if chat:
        head = ids.head("chatcmpl", "chat.completion.chunk")

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice]}

        events = [sse(chunk({"role": "assistant", "content": ""}, None))]
        finish = answer.finish_reason
        if shape == "tool":
            for i, piece in enumerate(tool_arguments(answer.pieces)):
                call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
                if i == 0:
                    call = {"index": 0, "id": tool_call_id(ids), "type": "function"}
                    call["function"] = {"name": TOOL_NAME, "arguments": piece}
                events.append(sse(chunk({"tool_calls": [call]}, None)))
            finish = "tool_calls" if finish == "stop" else finish
        elif shape == "reasoning":
            events += [sse(chunk({"reasoning_content": p}, None)) for p in answer.pieces]
        else:
            pieces = tool_arguments(answer.pieces) if shape == "json" else answer.pieces
            events += [sse(chunk({"content": piece}, None)) for piece in pieces]
        events.append(sse(chunk({}, finish)))
    else:
        head = ids.head("cmpl", "text_completion")

        def text_chunk(text: str, finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice]}

        events = [sse(text_chunk(piece, None)) for piece in answer.pieces]
        events.append(sse(text_chunk("", answer.finish_reason)))
    if include_usage:
        events.append(sse({**head, "choices": [], "usage": answer.usage()}))
    return events


def format_retry_after(seconds: float) -> str:
    """Whole seconds as an integer (``"2"``), fractions as a decimal (``"0.5"``)."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def fault_error(
    behaviour: Behaviour, prompt_tokens: int, auth: str | None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and extra headers of an error behaviour."""
    name = behaviour.name
    if name == "429":
        headers: dict[str, str] = {}
        if behaviour.retry_after is not None:
            headers["Retry-After"] = format_retry_after(behaviour.retry_after)
            headers["retry-after-ms"] = str(math.ceil(behaviour.retry_after * 1000))
        body = error_body(
            "Rate limit reached for requests (sim). Please try again later.",
            "requests",
            "rate_limit_exceeded",
        )
        return 429, body, headers
    if name == "500":
        message = "The server had an error while processing your request (sim)."
        return 500, error_body(message, "server_error", None), {}
    if name == "503":
        message = "The engine is currently overloaded, please try again later (sim)."
        return 503, error_body(message, "server_error", "service_unavailable"), {}
    if name == "context_length":
        message = (
            "This model's maximum context length is 8 tokens. However, your messages "
            f"resulted in {max(prompt_tokens, 9)} tokens. Please reduce the length of the "
            "messages. (sim)"
        )
        body = error_body(message, "invalid_request_error", "context_length_exceeded", "messages")
        return 400, body, {}
    if name == "content_filter":
        message = (
            "The response was filtered due to the prompt triggering content management "
            f"policy (sim: {behaviour.reason})"
        )
        return 400, error_body(message, "invalid_request_error", "content_filter", "prompt"), {}
    if name == "409":
        message = f"Conflict (sim: {behaviour.code})"
        return 409, error_body(message, "invalid_request_error", behaviour.code), {}
    if name == "401":
        key = auth.split()[-1] if auth and auth.split() else ""
        shown = f" ***{key[-4:]}" if key else ""
        message = f"Incorrect API key provided:{shown} (sim)."
        return 401, error_body(message, "invalid_request_error", "invalid_api_key"), {}
    raise ValueError(f"behaviour {name!r} is not an error behaviour")

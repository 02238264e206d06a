"""Bedrock's answers on plain dicts: a Converse answer, ConverseStream frames and errors as
chat answers, chunks or the taxonomy's failures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.providers.bedrock_answer import ConverseStream, parse_error, whole
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.eventstream import Frame

IDS = ("chatcmpl-1", 1700000000, "anthropic.claude-3-haiku")


def test_a_whole_answer_with_tool_use_becomes_tool_calls() -> None:
    data = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"text": "Looking"},
                    {"toolUse": {"toolUseId": "tu_9", "name": "lookup", "input": {"q": "x"}}},
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13},
    }
    answer = whole(data, IDS)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Looking"
    assert choice["message"]["tool_calls"][0]["id"] == "tu_9"
    assert answer["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}


def _event(name: str, payload: dict[str, Any]) -> Frame:
    headers = {":event-type": name, ":message-type": "event", ":content-type": "application/json"}
    return Frame(dict(headers), orjson.dumps(payload))


def test_a_converse_stream_becomes_chat_chunks() -> None:
    stream = ConverseStream(IDS)
    events = [
        _event("messageStart", {"role": "assistant"}),
        _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi "}}),
        _event("contentBlockStop", {"contentBlockIndex": 0}),
        _event(
            "contentBlockStart",
            {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t", "name": "f"}}},
        ),
        _event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a"'}}}
        ),
        _event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ":1}"}}}
        ),
        _event("contentBlockStop", {"contentBlockIndex": 1}),
        _event("messageStop", {"stopReason": "tool_use"}),
        _event("metadata", {"usage": {"inputTokens": 3, "outputTokens": 6}, "metrics": {}}),
    ]
    out = [c for e in events for c in stream.feed(e)] + stream.end(include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert deltas[1] == {"content": "Hi "}
    assert deltas[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:5])
    assert orjson.loads(arguments) == {"a": 1}
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["usage"]["total_tokens"] == 9


def test_an_exception_in_the_stream_is_a_failure_of_its_kind() -> None:
    stream = ConverseStream(IDS)
    frame = Frame(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"slow down"}',
    )
    with pytest.raises(Failure) as caught:
        stream.feed(frame)
    assert caught.value.kind is failures.RATE_LIMITED
    assert "slow down" in caught.value.message


def test_a_stream_without_message_stop_owes_no_closing_chunk() -> None:
    stream = ConverseStream(IDS)
    stream.feed(_event("messageStart", {"role": "assistant"}))
    assert not stream.finished
    assert stream.end(include_usage=True) == []  # the transport reports the cut


@pytest.mark.parametrize(
    ("status", "name", "message", "kind"),
    [
        (429, "ThrottlingException", "Too many requests", failures.RATE_LIMITED),
        (503, "ServiceUnavailableException", "try later", failures.SERVER_ERROR),
        (429, "ModelNotReadyException", "model is loading", failures.SERVER_ERROR),
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            failures.CONTEXT_LENGTH,
        ),
        (400, "ValidationException", "messages: field required", failures.CLIENT_ERROR),
        (403, "AccessDeniedException", "no access", failures.UPSTREAM_AUTH),
    ],
)
def test_bedrock_errors_map_to_the_taxonomy(
    status: int, name: str, message: str, kind: object
) -> None:
    headers = ((b"x-amzn-ErrorType", f"{name}:http://internal.amazon.com/".encode()),)
    failure = parse_error(status, orjson.dumps({"message": message}), headers)
    assert failure.kind is kind
    by_body = parse_error(
        status, orjson.dumps({"__type": f"com.amazon#{name}", "message": message})
    )
    assert by_body.kind is kind
    assert orjson.loads(failure.body or b"")["error"]["message"] == message


def test_prompt_cache_reads_and_writes_are_prompt_tokens_kept_apart() -> None:
    usage = {"inputTokens": 2, "outputTokens": 4, "cacheReadInputTokens": 50}
    data = {"output": {"message": {"content": [{"text": "x"}]}}, "usage": usage}
    assert whole(data, IDS)["usage"] == {
        "prompt_tokens": 52,
        "completion_tokens": 4,
        "total_tokens": 56,
        "prompt_tokens_details": {"cached_tokens": 50},
    }
    stream = ConverseStream(IDS)
    stream.feed(_event("messageStop", {"stopReason": "end_turn"}))
    written = {"inputTokens": 2, "outputTokens": 1, "cacheWriteInputTokens": 7}
    stream.feed(_event("metadata", {"usage": written}))
    (closing,) = stream.end(True)
    assert closing["usage"]["prompt_tokens"] == 9
    assert closing["usage"]["prompt_tokens_details"]["cache_write_tokens"] == 7


def test_the_caches_reads_and_writes_are_prompt_tokens() -> None:
    """Like Anthropic, Bedrock counts the cache's reads and writes apart from `inputTokens`."""
    usage = {
        "inputTokens": 10,
        "outputTokens": 4,
        "cacheReadInputTokens": 30,
        "cacheWriteInputTokens": 20,
        "totalTokens": 64,
    }
    data = {
        "output": {"message": {"role": "assistant", "content": [{"text": "x"}]}},
        "stopReason": "end_turn",
        "usage": usage,
    }
    assert whole(data, IDS)["usage"] == {
        "prompt_tokens": 60,
        "completion_tokens": 4,
        "total_tokens": 64,
        "prompt_tokens_details": {
            "cached_tokens": 30,
            "cache_write_tokens": 20,
            "cache_write_1h_tokens": 0,
        },
    }

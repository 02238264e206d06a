"""What Gemini answers (whole, streamed, or as an error) as the chat answer or the taxonomy's
failure a client of Ballast would see, on plain dicts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.providers.gemini_answer import GeminiStream, parse_error, whole
from ballast.resilience import failures
from ballast.resilience.failures import Failure

IDS = ("chatcmpl-1", 1700000000, "gemini-2.0-flash")


def test_a_whole_answer_with_a_function_call_becomes_tool_calls() -> None:
    data = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "lookup", "args": {"q": "x"}}}],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10},
    }
    answer = whole(data, IDS)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"] == {"name": "lookup", "arguments": '{"q":"x"}'}
    assert answer["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_a_blocked_prompt_is_a_content_refusal() -> None:
    with pytest.raises(Failure) as caught:
        whole({"promptFeedback": {"blockReason": "SAFETY"}}, IDS)
    assert caught.value.kind is failures.CONTENT_FILTER
    assert orjson.loads(caught.value.body or b"")["error"]["code"] == "content_filter"


def test_a_candidate_stopped_for_safety_finishes_with_content_filter() -> None:
    data = {"candidates": [{"content": {"parts": [{"text": "I"}]}, "finishReason": "SAFETY"}]}
    assert whole(data, IDS)["choices"][0]["finish_reason"] == "content_filter"


def test_a_stream_becomes_chat_chunks_with_usage_at_the_end() -> None:
    stream = GeminiStream(IDS)
    out = stream.feed({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]})
    out += stream.feed(
        {
            "candidates": [
                {
                    "content": {
                        "parts": [{"text": "lo"}, {"functionCall": {"name": "f", "args": {}}}]
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 5},
        }
    )
    out += stream.end(include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "Hello"
    assert deltas[3]["tool_calls"][0]["index"] == 0
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}


def test_a_stream_that_never_finishes_owes_no_closing_chunk() -> None:
    stream = GeminiStream(IDS)
    stream.feed({"candidates": [{"content": {"parts": [{"text": "a"}]}}]})
    assert not stream.finished
    assert stream.end(include_usage=True) == []  # the transport reports the cut


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (429, {"status": "RESOURCE_EXHAUSTED", "message": "quota"}, failures.RATE_LIMITED),
        (503, {"status": "UNAVAILABLE", "message": "overloaded"}, failures.SERVER_ERROR),
        (401, {"status": "UNAUTHENTICATED", "message": "bad token"}, failures.UPSTREAM_AUTH),
        (
            400,
            {
                "status": "INVALID_ARGUMENT",
                "message": "The input token count (1048577) exceeds the maximum number of tokens",
            },
            failures.CONTEXT_LENGTH,
        ),
        (400, {"status": "INVALID_ARGUMENT", "message": "bad field"}, failures.CLIENT_ERROR),
    ],
)
def test_gemini_errors_map_to_the_taxonomy(
    status: int, error: dict[str, str], kind: object
) -> None:
    failure = parse_error(status, orjson.dumps({"error": {"code": status, **error}}))
    assert failure.kind is kind
    assert failure.status == status


def test_a_retry_delay_in_the_error_stands_in_for_retry_after() -> None:
    body = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "quota",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12s"}],
        }
    }
    assert parse_error(429, orjson.dumps(body)).retry_after == 12.0
    assert parse_error(429, orjson.dumps(body), retry_after=3.0).retry_after == 3.0


def test_cached_tokens_and_thoughts_reach_the_chat_usage() -> None:
    """Gemini counts the cached tokens inside `promptTokenCount` and the thoughts apart from
    `candidatesTokenCount`, though both are billed as output: the completion holds both."""
    meta = {
        "promptTokenCount": 100,
        "cachedContentTokenCount": 60,
        "candidatesTokenCount": 5,
        "thoughtsTokenCount": 12,
        "totalTokenCount": 117,
    }
    candidate: dict[str, Any] = {"content": {"parts": [{"text": "hi"}]}}
    data: dict[str, Any] = {"candidates": [candidate], "usageMetadata": meta}
    assert whole(data, IDS)["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 17,
        "total_tokens": 117,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    stream = GeminiStream(IDS)
    stream.feed({**data, "candidates": [{**candidate, "finishReason": "STOP"}]})
    assert stream.end(include_usage=True)[-1]["usage"]["completion_tokens"] == 17

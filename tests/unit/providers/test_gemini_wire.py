"""Chat <-> Gemini translation on plain dicts: what a chat client sends is said as Gemini
expects it, and what Gemini answers (whole, streamed, or as an error) becomes the chat answer
or the taxonomy's failure a client of Ballast would see."""

from __future__ import annotations

import orjson
import pytest
from google.genai import types

from ballast.providers.gemini_answer import GeminiStream, parse_error, whole
from ballast.providers.gemini_request import gemini_body
from ballast.resilience import failures
from ballast.resilience.failures import Failure

IDS = ("chatcmpl-1", 1700000000, "gemini-2.0-flash")
PIXEL = "iVBORw0KGgo="
IMAGE = {"url": f"data:image/png;base64,{PIXEL}"}
SCHEMA = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def test_a_conversation_with_a_tool_round_trip_is_said_as_gemini_contents() -> None:
    body = gemini_body(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PIXEL}"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": "png"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_a", "content": '{"answer": "an image"}'},
                {"role": "tool", "tool_call_id": "call_a", "content": "plain text"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 64,
            "stop": "END",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"type": "object"}},
            },
        }
    )
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    user, model, results = body["contents"]
    assert user["role"] == "user"
    assert user["parts"][1] == {"inlineData": {"mimeType": "image/png", "data": PIXEL}}
    assert model == {
        "role": "model",
        "parts": [{"functionCall": {"name": "lookup", "args": {"q": "png"}}}],
    }
    assert results["role"] == "user"  # both results merged into one turn
    assert [p["functionResponse"]["response"] for p in results["parts"]] == [
        {"answer": "an image"},
        {"content": "plain text"},
    ]
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "lookup"
    assert body["toolConfig"]["functionCallingConfig"] == {
        "mode": "ANY",
        "allowedFunctionNames": ["lookup"],
    }
    assert body["generationConfig"] == {
        "temperature": 0.2,
        "topP": 0.9,
        "maxOutputTokens": 64,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseSchema": {"type": "object"},
    }
    # The SDK's own model of the request accepts every field as Gemini names it.
    types.GenerateContentConfig.model_validate(
        {"system_instruction": body["systemInstruction"], **body["generationConfig"]}
    )
    for content in body["contents"]:
        types.Content.model_validate(content)


def test_a_json_schema_is_said_in_geminis_subset() -> None:
    strict = {
        "type": "object",
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
        "properties": {
            "name": {"type": ["string", "null"], "description": "who"},
            "tags": {"type": "array", "items": {"type": "string", "additionalProperties": False}},
        },
        "required": ["name"],
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                              "schema": strict}}  # fmt: skip
    body = gemini_body({"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": strict}}
    ], "response_format": response_format})  # fmt: skip
    expected = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "nullable": True, "description": "who"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name"],
    }
    assert body["generationConfig"]["responseSchema"] == expected
    assert body["tools"][0]["functionDeclarations"][0]["parameters"] == expected
    types.Schema.model_validate(expected)  # the SDK's model of Gemini's Schema takes it


def test_a_tool_result_without_its_call_is_the_clients_error() -> None:
    with pytest.raises(Failure) as caught:
        gemini_body({"messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}]})
    assert caught.value.kind is failures.CLIENT_ERROR
    assert b"tool call made before" in (caught.value.body or b"")


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

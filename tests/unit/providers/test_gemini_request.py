"""A chat request said as Gemini expects it, on plain dicts: contents, tools, a JSON schema in
Gemini's subset, and the client's own errors."""

from __future__ import annotations

import pytest
from google.genai import types

from ballast.providers.gemini_request import gemini_body
from ballast.resilience import failures
from ballast.resilience.failures import Failure

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

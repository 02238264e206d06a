"""A chat answer as a Response the official SDK's own types validate."""

from __future__ import annotations

from openai.types.responses import Response, ResponseUsage

from ballast.api.responses.answer import to_response, usage_of


def test_a_chat_answer_is_a_response_the_sdk_validates() -> None:
    chat = {
        "id": "chatcmpl-1",
        "model": "up-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "calling",
                    "reasoning_content": "think",
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a":1}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
    request = {"model": "m", "input": "x", "metadata": {"k": "v"}, "temperature": 0.5}
    response = Response.model_validate(to_response(chat, request, "resp_1", 5))
    assert response.id == "resp_1" and response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "calling"
    call = response.output[2]
    assert call.type == "function_call" and call.call_id == "call_9" and call.name == "f"
    assert response.usage is not None and response.usage.total_tokens == 10
    assert response.metadata == {"k": "v"} and response.temperature == 0.5


def test_a_length_cut_answer_is_incomplete() -> None:
    chat = {"choices": [{"finish_reason": "length", "message": {"content": "par"}}]}
    response = Response.model_validate(to_response(chat, {"model": "m"}, "resp_2", 5))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_the_caches_reads_and_writes_and_reasoning_are_in_the_usage() -> None:
    chat = {
        "prompt_tokens": 100,
        "completion_tokens": 30,
        "total_tokens": 130,
        "prompt_tokens_details": {
            "cached_tokens": 20,
            "cache_write_tokens": 50,
            "cache_write_1h_tokens": 10,
        },
        "completion_tokens_details": {"reasoning_tokens": 25},
    }
    written = usage_of(chat)
    assert written is not None
    usage = ResponseUsage.model_validate(written)
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (100, 30, 130)
    assert usage.input_tokens_details.cached_tokens == 20
    assert usage.input_tokens_details.cache_write_tokens == 50
    assert usage.output_tokens_details.reasoning_tokens == 25
    assert written["input_tokens_details"]["cache_write_1h_tokens"] == 10
    plain = usage_of({"prompt_tokens": 3, "completion_tokens": 1})
    assert plain == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 4,
    }

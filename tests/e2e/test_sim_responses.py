"""The simulator's Responses wire, judged by the official SDK pointed at it directly: the
native pass-through tests rely on it speaking the API as OpenAI does."""

from __future__ import annotations

import openai
import pytest

from tests.stack import Stack

FULL = "".join(f"tok{i} " for i in range(16))


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


def test_text_whole_and_streamed(stack: Stack) -> None:
    api = sdk(stack.sim().url)
    response = api.responses.create(model="m", input="hello there", instructions="brief")
    assert response.output_text == FULL
    assert response.status == "completed" and response.instructions == "brief"
    assert response.usage is not None and response.usage.output_tokens == 16
    with api.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == FULL and final.output_text == FULL


def test_tool_call_then_text_after_its_result(stack: Stack) -> None:
    api = sdk(stack.sim("ok?shape=tool&tokens=3").url)
    first = api.responses.create(model="m", input="look it up")
    (call,) = first.output
    assert call.type == "function_call" and call.name == "lookup"
    assert call.arguments == '{"q": "tok0 tok1 tok2 "}'
    with api.responses.stream(model="m", input="look it up") as stream:
        streamed = stream.get_final_response()
    assert streamed.output[0].type == "function_call"
    second = api.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "look it up"},
            {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
        ],
    )
    assert second.output_text == "tok0 tok1 tok2 "


def test_faults_speak_openai_errors(stack: Stack) -> None:
    api = sdk(stack.sim("429").url)
    with pytest.raises(openai.RateLimitError):
        api.responses.create(model="m", input="x")
    cut = sdk(stack.sim("cut?after=2").url)
    with pytest.raises(openai.APIConnectionError), cut.responses.stream(model="m", input="x") as s:
        for _ in s:
            pass

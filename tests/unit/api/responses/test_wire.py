"""The Responses bridge's translation, judged by the official SDK's own types: a request
becomes the chat completion it means (or a 400 naming what cannot be honoured), a chat
answer becomes a Response the SDK validates, and chat chunks become the event sequence the
SDK's stream accumulator turns back into the same Response."""

from __future__ import annotations

import typing
from typing import Any

import orjson
import pydantic
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from ballast.api.responses.answer import to_response
from ballast.api.responses.request import to_chat
from ballast.api.responses.stream import Phase, ResponseStream
from ballast.pipeline.errors import ApiError

# Each event type's own SDK class, so a mismatch names the field that is wrong.
EVENTS: dict[str, type[pydantic.BaseModel]] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = to_chat(
        {"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 5}
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }


def test_items_become_messages_tool_calls_and_tool_results() -> None:
    chat = to_chat(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "rules"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                    ],
                },
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                },
            ],
        }
    )
    messages = chat["messages"]
    assert messages[0] == {"role": "system", "content": "rules"}
    assert messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA"},
    }
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert messages[5] == {"role": "assistant", "content": "done"}


def test_tools_choice_format_reasoning_and_stream_are_translated() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = to_chat(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
            "reasoning": {"effort": "low", "summary": "auto"},
            "metadata": {"k": "v"},
            "store": False,
            "include": [],
            "stream": True,
        }
    )
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema},
    }
    assert chat["reasoning_effort"] == "low"
    assert chat["stream_options"] == {"include_usage": True}
    assert "metadata" not in chat and "store" not in chat  # kept by Ballast, not sent


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        to_chat({"model": "m", "input": "x", **extra})
    assert caught.value.status == 400
    assert caught.value.param == param
    assert orjson.loads(caught.value.body())["error"]["param"] == param


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


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"model": "up", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _parse(wire: bytes) -> list[Any]:
    events = []
    for block in wire.split(b"\n\n"):
        if not block:
            continue
        name, data = block.split(b"\n", 1)
        assert name.startswith(b"event: ")
        kind = name[7:].decode()
        event: Any = EVENTS[kind].model_validate(orjson.loads(data[len(b"data: ") :]))
        assert event.type == kind
        events.append(event)
    return events


def _accumulate(events: list[Any]) -> Any:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(event)
    return state


def test_a_stream_of_reasoning_text_and_calls_is_the_sdks_event_sequence() -> None:
    translator = ResponseStream({"model": "m"}, "resp_3", 9, "")
    wire = translator.start()
    wire += translator.feed(_chunk({"role": "assistant", "reasoning_content": "hm"}))
    wire += translator.feed(_chunk({"content": "Hel"}) + _chunk({"content": "lo"}))
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}
    wire += translator.feed(_chunk({"tool_calls": [call]}))
    more = {"index": 0, "function": {"arguments": ":1}"}}
    wire += translator.feed(_chunk({"tool_calls": [more]}, "tool_calls"))
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}}
    wire += translator.feed(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
    events = _parse(wire)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds
    assert kinds.count("response.output_text.delta") == 2
    assert kinds.count("response.function_call_arguments.delta") == 2
    final = events[-1].response
    assert final.output_text == "Hello"
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == '{"a":1}'
    assert final.usage.total_tokens == 6
    state = _accumulate(events)
    assert state._completed_response is not None
    assert state._completed_response.output_text == "Hello"
    assert translator.phase is Phase.ENDED
    assert translator.feed(_chunk({"content": "late"})) == b""


def test_a_broken_stream_ends_with_response_failed_and_before_start_with_error() -> None:
    translator = ResponseStream({"model": "m"}, "resp_4", 9, "m")
    wire = translator.feed(_chunk({"content": "par"}))
    wire += translator.feed(b'data: {"error":{"message":"cut","code":"stream_cut"}}\n\n')
    events = _parse(wire)
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.message == "cut"
    assert "response.completed" not in [e.type for e in events]
    unopened = ResponseStream({"model": "m"}, "resp_5", 9, "m")
    (error,) = _parse(unopened.fail("no deployment could answer", "upstream_error"))
    assert error.type == "error" and error.code == "upstream_error"


def test_a_stream_cut_by_max_tokens_is_incomplete() -> None:
    translator = ResponseStream({"model": "m"}, "resp_6", 9, "m")
    wire = translator.feed(_chunk({"content": "par"}, "length") + b"data: [DONE]\n\n")
    events = _parse(wire)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_streamed_refusal_is_a_refusal_part() -> None:
    translator = ResponseStream({"model": "m"}, "resp_7", 9, "m")
    wire = translator.feed(_chunk({"refusal": "I can"}) + _chunk({"refusal": "not."}, "stop"))
    events = _parse(wire + translator.feed(b"data: [DONE]\n\n"))
    kinds = [e.type for e in events]
    assert kinds.count("response.refusal.delta") == 2 and "response.refusal.done" in kinds
    (message,) = events[-1].response.output
    assert message.content[0].type == "refusal"
    assert message.content[0].refusal == "I cannot."
    assert _accumulate(events)._completed_response is not None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"instructions": ["x"]}, "instructions"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
def test_malformed_requests_are_400s_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        to_chat({"model": "m", "input": "x", **extra})
    assert caught.value.status == 400 and caught.value.param == param

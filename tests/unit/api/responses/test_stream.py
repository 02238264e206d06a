"""Chat chunks as the Responses event sequence, each event judged by the SDK's own class and
the whole stream by the SDK's accumulator, which must give back the same Response."""

from __future__ import annotations

import typing
from typing import Any

import orjson
import pydantic
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from ballast.api.responses.stream import Phase, ResponseStream
from ballast.pipeline.errors import ApiError
from ballast.stream.event import events_of

# Each event type's own SDK class, so a mismatch names the field that is wrong.
EVENTS: dict[str, type[pydantic.BaseModel]] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


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


def feed(translator: ResponseStream, data: bytes) -> bytes:
    """The translator fed relayed bytes, as typed events."""
    return translator.feed(events_of(data))


def _accumulate(events: list[Any]) -> Any:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(event)
    return state


def test_a_stream_of_reasoning_text_and_calls_is_the_sdks_event_sequence() -> None:
    translator = ResponseStream({"model": "m"}, "resp_3", 9, "")
    wire = translator.start()
    wire += feed(translator, _chunk({"role": "assistant", "reasoning_content": "hm"}))
    wire += feed(translator, _chunk({"content": "Hel"}) + _chunk({"content": "lo"}))
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}
    wire += feed(translator, _chunk({"tool_calls": [call]}))
    more = {"index": 0, "function": {"arguments": ":1}"}}
    wire += feed(translator, _chunk({"tool_calls": [more]}, "tool_calls"))
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}}
    wire += feed(translator, b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
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
    assert feed(translator, _chunk({"content": "late"})) == b""


def test_a_broken_stream_ends_with_response_failed_and_before_start_with_error() -> None:
    translator = ResponseStream({"model": "m"}, "resp_4", 9, "m")
    wire = feed(translator, _chunk({"content": "par"}))
    wire += translator.fail(ApiError(502, "cut", "api_error", "stream_cut"))
    events = _parse(wire)
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.message == "cut"
    assert "response.completed" not in [e.type for e in events]
    unopened = ResponseStream({"model": "m"}, "resp_5", 9, "m")
    failure = ApiError(502, "no deployment could answer", "api_error", "upstream_error")
    (error,) = _parse(unopened.fail(failure))
    assert error.type == "error" and error.code == "upstream_error"


def test_a_stream_cut_by_max_tokens_is_incomplete() -> None:
    translator = ResponseStream({"model": "m"}, "resp_6", 9, "m")
    wire = feed(translator, _chunk({"content": "par"}, "length") + b"data: [DONE]\n\n")
    events = _parse(wire)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_streamed_refusal_is_a_refusal_part() -> None:
    translator = ResponseStream({"model": "m"}, "resp_7", 9, "m")
    wire = feed(translator, _chunk({"refusal": "I can"}) + _chunk({"refusal": "not."}, "stop"))
    events = _parse(wire + feed(translator, b"data: [DONE]\n\n"))
    kinds = [e.type for e in events]
    assert kinds.count("response.refusal.delta") == 2 and "response.refusal.done" in kinds
    (message,) = events[-1].response.output
    assert message.content[0].type == "refusal"
    assert message.content[0].refusal == "I cannot."
    assert _accumulate(events)._completed_response is not None

"""Hostile input through the Gemini and Bedrock translations: any chat request, any answer,
any stream chunk becomes a translation or the taxonomy's Failure (a clear error in the
client's own format), never another exception escaping."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.providers import bedrock_answer, gemini_answer
from ballast.providers.bedrock_request import converse_body
from ballast.providers.gemini_request import gemini_body
from ballast.resilience.failures import Failure
from ballast.upstream.eventstream import Frame

FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
IDS = ("chatcmpl-1", 0, "m")

scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "bogus"])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "audio"])},
    optional={"text": values, "image_url": values},
)
messages = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": st.none() | st.text(max_size=10) | st.lists(parts, max_size=3) | values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": values,
                    "function": st.fixed_dictionaries({"name": values, "arguments": values}),
                }
            ),
            max_size=2,
        )
        | values,
        "tool_call_id": values,
    },
)
requests = st.fixed_dictionaries(
    {"messages": st.lists(messages | values, max_size=4) | values},
    optional={
        key: values
        for key in (
            "tools", "tool_choice", "temperature", "top_p", "max_tokens", "stop",
            "response_format", "seed", "max_completion_tokens",
        )
    },
)  # fmt: skip


def _only_failures(translate: Any, *args: Any) -> None:
    try:
        result = translate(*args)
    except Failure as failure:
        assert failure.body and orjson.loads(failure.body)["error"]["code"]
        return
    orjson.dumps(result)  # whatever came out can be sent


@FAST
@given(requests)
def test_any_chat_request_translates_or_is_a_clear_error(payload: dict[str, Any]) -> None:
    _only_failures(gemini_body, payload)
    _only_failures(converse_body, payload)


@FAST
@given(values)
def test_any_answer_translates_or_is_a_clear_error(data: Any) -> None:
    _only_failures(gemini_answer.whole, data, IDS)
    _only_failures(bedrock_answer.whole, data, IDS)
    _only_failures(gemini_answer.GeminiStream(IDS).feed, data)
    wrapped = {"candidates": [data], "usageMetadata": data}
    _only_failures(gemini_answer.whole, wrapped, IDS)
    _only_failures(bedrock_answer.whole, {"output": {"message": data}, "usage": data}, IDS)


@FAST
@given(
    st.sampled_from(["messageStart", "contentBlockStart", "contentBlockDelta", "messageStop",
                     "metadata", "other"]),
    values,
    st.sampled_from(["event", "exception"]),
)  # fmt: skip
def test_any_converse_event_translates_or_is_a_clear_error(name: str, data: Any, kind: str) -> None:
    frame = Frame({":event-type": name, ":message-type": kind}, orjson.dumps(data))
    _only_failures(bedrock_answer.ConverseStream(IDS).feed, frame)


@FAST
@given(st.integers(100, 599), st.binary(max_size=60) | values.map(orjson.dumps))
def test_any_error_answer_is_classified(status: int, body: bytes) -> None:
    assert gemini_answer.parse_error(status, body).kind is not None
    assert bedrock_answer.parse_error(status, body).kind is not None

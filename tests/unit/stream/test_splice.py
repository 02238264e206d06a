"""Splicing a continuation onto what the client already has."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest

from ballast.stream.event import read
from ballast.stream.splice import Diverged, Sent, Splice


def chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    payload = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def content(event: bytes | None) -> str | None:
    if event is None:
        return None
    payload = orjson.loads(event[len(b"data: ") :])
    return payload["choices"][0]["delta"].get("content")  # type: ignore[no-any-return]


def apply(splice: Splice, event: bytes) -> bytes | None:
    """`splice.apply` to a relayed event; the bytes the client gets, or None."""
    kept = splice.apply(read(event.rstrip(b"\n")))
    return None if kept is None else kept.raw


def test_regeneration_drops_what_the_client_has_and_relays_the_rest() -> None:
    splice = Splice(Sent("tok0 tok1 "), regenerate=True)
    assert apply(splice, chunk("", role=True)) is None
    assert apply(splice, chunk("tok0 ")) is None
    assert content(apply(splice, chunk("tok1 tok2 "))) == "tok2 "
    assert content(apply(splice, chunk("tok3 "))) == "tok3 "
    assert apply(splice, chunk(finish="stop")) is not None
    assert apply(splice, b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


def test_prefill_continuation_only_loses_its_role() -> None:
    splice = Splice(Sent("tok0 tok1 "), regenerate=False)
    assert apply(splice, chunk("", role=True)) is None
    assert content(apply(splice, chunk("tok2 "))) == "tok2 "


def test_a_different_regenerated_answer_diverges() -> None:
    splice = Splice(Sent("tok0 tok1 "), regenerate=True)
    with pytest.raises(Diverged):
        apply(splice, chunk("other "))


@pytest.mark.parametrize("end", [chunk(finish="stop"), b"data: [DONE]\n\n"])
def test_a_regenerated_answer_that_ends_early_diverges(end: bytes) -> None:
    splice = Splice(Sent("tok0 tok1 tok2 "), regenerate=True)
    assert apply(splice, chunk("tok0 ")) is None
    with pytest.raises(Diverged):
        apply(splice, end)


def tool_chunk(
    arguments: str, name: str | None = None, call_id: str | None = None, finish: str | None = None
) -> bytes:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if name is not None:
        call["function"]["name"] = name
        call["id"] = call_id
        call["type"] = "function"
    payload = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def calls_of(event: bytes | None) -> Any:
    if event is None:
        return None
    return orjson.loads(event[len(b"data: ") :])["choices"][0]["delta"].get("tool_calls")


def test_a_regenerated_tool_call_relays_only_the_rest_of_its_arguments() -> None:
    sent = Sent(tools={0: ("lookup", '{"q": "tok0 ')})
    splice = Splice(sent, regenerate=True)
    assert apply(splice, tool_chunk('{"q": ', name="lookup", call_id="call_new")) is None
    assert calls_of(apply(splice, tool_chunk('"tok0 tok1 '))) == [
        {"index": 0, "function": {"arguments": "tok1 "}}
    ]
    assert apply(splice, tool_chunk('"}', finish="tool_calls")) is not None


@pytest.mark.parametrize(
    "other",
    [
        tool_chunk('{"q": "tok0 ', name="search", call_id="c"),  # another tool
        tool_chunk('{"x": ', name="lookup", call_id="c"),  # other arguments
    ],
)
def test_a_regenerated_tool_call_that_differs_diverges(other: bytes) -> None:
    splice = Splice(Sent(tools={0: ("lookup", '{"q": "tok0 ')}), regenerate=True)
    with pytest.raises(Diverged):
        apply(splice, other)


def test_a_tool_call_that_ends_before_the_clients_arguments_diverges() -> None:
    splice = Splice(Sent(tools={0: ("lookup", '{"q": "tok0 tok1 ')}), regenerate=True)
    assert apply(splice, tool_chunk('{"q": "tok0 ', name="lookup", call_id="c")) is None
    with pytest.raises(Diverged):
        apply(splice, tool_chunk("", finish="tool_calls"))


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices": {"0": {"delta": {"content": "x"}}}}\n\n',  # choices as an object
        b'data: {"choices": [{"delta": {"content": 7}}]}\n\n',  # numeric content
        b'data: {"choices": [{"delta": {"tool_calls": "x"}}]}\n\n',
        b"data: {broken\n\n",
    ],
)
def test_odd_chunk_shapes_pass_or_diverge_but_never_raise_anything_else(event: bytes) -> None:
    splice = Splice(Sent("tok0 "), regenerate=True)
    with contextlib.suppress(Diverged):
        apply(splice, event)


def test_a_splice_leaves_the_event_it_read_as_it_was() -> None:
    # The relay checks a continuation's first events with one splice, then relays them
    # through another: the payload every reader shares must not be cut by the first.
    event = read(chunk("tok0 tok1 tok2 ", role=True).rstrip(b"\n"))
    for _ in range(2):
        kept = Splice(Sent("tok0 tok1 "), regenerate=True).apply(event)
        assert kept is not None and content(kept.raw) == "tok2 "
    assert event.json["choices"][0]["delta"] == {"role": "assistant", "content": "tok0 tok1 tok2 "}

"""Splicing a continuation onto what the client already has."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest

from ballast.stream.event import read
from ballast.stream.splice import Diverged, Sent, Splice
from ballast.stream.state import StreamState


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


def test_a_prefill_carries_text_only() -> None:
    assert Sent("tok0 ").prefill == "tok0 "
    assert Sent("tok0 ", tools={0: ("lookup", '{"q": ')}).prefill is None  # a call under way
    assert Sent("tok0 ", reasoning="hm").prefill is None
    assert Sent("").prefill is None


def test_a_regeneration_says_nothing_new_before_the_clients_tool_call_is_whole_again() -> None:
    sent = Sent("Let me look. ", tools={0: ("lookup", '{"q": "tok0 ')})
    splice = Splice(sent, regenerate=True)
    assert apply(splice, chunk("Let me look. ")) is None
    with pytest.raises(Diverged):  # more text, where the client's answer went on with a call
        apply(splice, chunk("And more. "))


def test_a_regeneration_that_opens_another_call_first_diverges() -> None:
    splice = Splice(Sent(tools={0: ("lookup", '{"q": "tok0 ')}), regenerate=True)
    other = {"index": 1, "id": "c2", "type": "function", "function": {"name": "lookup"}}
    payload = {"choices": [{"index": 0, "delta": {"tool_calls": [other]}}]}
    with pytest.raises(Diverged):
        apply(splice, b"data: " + orjson.dumps(payload) + b"\n\n")


def test_arguments_cut_inside_an_escape_are_matched_as_the_text_they_are() -> None:
    # The client has the arguments up to the backslash of `\n`: the rest of the same
    # encoding completes them; another encoding of the same string is another answer.
    splice = Splice(Sent(tools={0: ("lookup", '{"q": "a\\')}), regenerate=True)
    assert apply(splice, tool_chunk('{"q": "a', name="lookup", call_id="c")) is None
    rest = calls_of(apply(splice, tool_chunk('\\nb"}')))
    assert rest == [{"index": 0, "function": {"arguments": 'nb"}'}}]
    assert orjson.loads('{"q": "a\\' + rest[0]["function"]["arguments"]) == {"q": "a\nb"}
    splice = Splice(Sent(tools={0: ("lookup", '{"q": "\\u00e9')}), regenerate=True)
    with pytest.raises(Diverged):
        apply(splice, tool_chunk('{"q": "é"}', name="lookup", call_id="c"))


def reasoning_chunk(text: str) -> bytes:
    payload = {"choices": [{"index": 0, "delta": {"reasoning_content": text}}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@pytest.mark.parametrize("regenerate", [True, False])
def test_reasoning_said_before_what_the_client_has_is_left_out(regenerate: bool) -> None:
    splice = Splice(Sent("tok0 "), regenerate=regenerate)
    assert apply(splice, reasoning_chunk("thinking first")) is None
    said = chunk("tok0 tok1 " if regenerate else "tok1 ")
    assert content(apply(splice, said)) == "tok1 "
    state = StreamState()
    for event in (reasoning_chunk("thinking first"), said):
        state.observe(orjson.loads(event[len(b"data: ") :]))
    assert splice.sent(state) == Sent("tok0 tok1 ")  # no reasoning: the client got none


def test_reasoning_the_client_has_must_be_said_again() -> None:
    splice = Splice(Sent(reasoning="step one, "), regenerate=True)
    assert apply(splice, reasoning_chunk("step one, ")) is None
    kept = apply(splice, reasoning_chunk("step two"))
    assert kept is not None and orjson.loads(kept[6:])["choices"][0]["delta"] == {
        "reasoning_content": "step two"
    }
    with pytest.raises(Diverged):
        apply(Splice(Sent(reasoning="step one, "), regenerate=True), reasoning_chunk("other"))


def observed(*events: bytes) -> StreamState:
    state = StreamState()
    for event in events:
        state.observe(orjson.loads(event[len(b"data: ") :]))
    return state


def test_what_the_client_has_after_a_regeneration_cut_before_it_caught_up() -> None:
    # The regenerated stream broke having said only part of the client's answer again:
    # the client still has all of it, and a next continuation must start from there.
    sent = Sent("tok0 tok1 tok2 ", tools={0: ("lookup", '{"q": "x')})
    splice = Splice(sent, regenerate=True)
    state = observed(chunk("tok0 "))
    assert apply(splice, chunk("tok0 ")) is None
    assert splice.sent(state) == sent
    # Once caught up and past it, the client has what the stream said.
    splice = Splice(Sent("tok0 tok1 "), regenerate=True)
    events = [chunk("tok0 tok1 "), chunk("tok2 ")]
    splice.apply_all([read(e.rstrip(b"\n")) for e in events])
    assert splice.sent(observed(*events)) == Sent("tok0 tok1 tok2 ")


def test_what_the_client_has_after_a_prefilled_continuation() -> None:
    splice = Splice(Sent("tok0 tok1 "), regenerate=False)
    events = [chunk("", role=True), chunk("tok2 "), tool_chunk('{"q": ', name="lookup")]
    splice.apply_all([read(e.rstrip(b"\n")) for e in events])
    assert splice.sent(observed(*events)) == Sent(
        "tok0 tok1 tok2 ", tools={0: ("lookup", '{"q": ')}
    )

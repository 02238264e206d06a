"""The typed stream event: its name read off its bytes, its data parsed at most once."""

from __future__ import annotations

from ballast.stream.event import DONE_EVENT, NOT_JSON, StreamEvent, events_of, read


def test_a_named_event_keeps_its_name_and_an_unnamed_one_has_none() -> None:
    named, plain = events_of(
        b'event:  message_stop \ndata: {"type":"message_stop"}\n\ndata: {"choices":[]}\n\n'
    )
    assert named.name == b"message_stop"
    assert named.json == {"type": "message_stop"}
    assert plain.name is None
    assert DONE_EVENT.name is None and DONE_EVENT.done


def test_an_event_made_here_carries_its_name_and_payload_without_a_parse() -> None:
    event = StreamEvent.of({"type": "ping"}, b"ping")
    assert event.raw == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert event.name == b"ping"
    assert event.json == {"type": "ping"}


def test_data_is_parsed_once_and_bad_data_is_not_json() -> None:
    event = read(b"data: {not json")
    assert event.json is NOT_JSON
    good = read(b'data: {"a":1}')
    assert good.json is good.json

"""The observer's ring of recent requests: the metadata of the last few (never a body),
newest first, bounded, and none kept when switched off."""

from __future__ import annotations

from dataclasses import dataclass

from ballast.observe.hub import Observer
from ballast.resilience.clock import ManualClock
from ballast.state.keys import KeyRecord


@dataclass
class Trace:
    request_id: str
    status: int = 429
    began: float = 0.0
    first: float = 0.0
    stream_error: bool = False
    deployment: str | None = None
    error_code: str | None = "rate_limit_exceeded"


KEY = KeyRecord(id="key_1", name="ci", team_id="team_1")


def test_the_last_requests_are_kept_newest_first_within_the_bound() -> None:
    clock = ManualClock()
    observer = Observer(lambda: [], clock, recent_requests=2)
    for n in range(3):
        trace = Trace(f"r{n}", began=clock.monotonic())
        clock.advance(0.75)
        observer.request(trace, None, None, "/chat/completions", False, KEY, "/v1/messages")
    rows = observer.recent_requests(10)
    assert [r["request_id"] for r in rows] == ["r2", "r1"]
    newest = rows[0]
    assert (newest["key_id"], newest["key_name"], newest["team_id"]) == ("key_1", "ci", "team_1")
    assert (newest["path"], newest["status"], newest["error_code"]) == (
        "/v1/messages",
        429,
        "rate_limit_exceeded",
    )
    assert newest["latency_ms"] == 750.0 and newest["cost"] is None
    assert not {"body", "messages", "payload"} & newest.keys()
    assert [r["request_id"] for r in observer.recent_requests(1)] == ["r2"]


def test_none_are_kept_when_switched_off() -> None:
    observer = Observer(lambda: [], ManualClock(), recent_requests=0)
    observer.request(Trace("r0"), None, None, "/chat/completions", False, KEY)
    assert observer.requests is None and observer.recent_requests(10) == []

"""Client sessions: handed out per key, ended on idle (on the injected clock), at the bound,
or when asked; each end tells the gateway, which ends the upstream sessions."""

from __future__ import annotations

from ballast.mcp.sessions import ClientSessions
from ballast.resilience.clock import ManualClock


def make(idle: float = 60.0, limit: int = 10) -> tuple[ClientSessions, list[str], ManualClock]:
    clock = ManualClock()
    ended: list[str] = []
    return ClientSessions(idle, limit, ended.append, clock), ended, clock


def test_a_session_is_only_for_the_key_that_opened_it() -> None:
    sessions, _, _ = make()
    session = sessions.open("key_a", "2025-11-25")
    assert sessions.use(session.id, "key_b") is None
    assert sessions.use(session.id, "key_a") is session


def test_an_idle_session_ends_and_a_used_one_does_not() -> None:
    sessions, ended, clock = make(idle=60.0)
    idle = sessions.open(None, "2025-11-25")
    busy = sessions.open(None, "2025-11-25")
    clock.advance(40)
    assert sessions.use(busy.id, None) is busy
    clock.advance(30)
    assert sessions.use(idle.id, None) is None
    assert sessions.use(busy.id, None) is busy
    assert ended == [idle.id]


def test_past_the_bound_the_least_recently_used_session_ends() -> None:
    sessions, ended, clock = make(limit=2)
    first = sessions.open(None, "v")
    second = sessions.open(None, "v")
    clock.advance(1)
    sessions.use(first.id, None)
    sessions.open(None, "v")
    assert ended == [second.id] and len(sessions) == 2


def test_ending_twice_tells_once() -> None:
    sessions, ended, _ = make()
    session = sessions.open(None, "v")
    assert sessions.end(session.id) and not sessions.end(session.id)
    assert ended == [session.id]

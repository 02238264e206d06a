"""Client sessions of the handshake revisions: the id Ballast hands out at `initialize`,
whose key opened it, and when it was last used. Kept in memory, in order of last use, so
idle ones are found at the front; a session that ends (DELETE, idle, the bound) tells
`on_end`, which ends its sessions on the servers."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ballast.resilience.clock import SYSTEM_CLOCK, Clock


@dataclass(slots=True)
class ClientSession:
    id: str
    key_id: str | None  # the key that opened it; another key cannot use it
    version: str
    last_used: float


class ClientSessions:
    def __init__(
        self,
        idle: float,
        limit: int,
        on_end: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.idle = idle
        self.limit = limit
        self._on_end = on_end
        self._clock = clock
        self._sessions: dict[str, ClientSession] = {}  # oldest use first

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, key_id: str | None, version: str) -> ClientSession:
        self._sweep()
        while len(self._sessions) >= self.limit:
            self.end(next(iter(self._sessions)))
        session = ClientSession(secrets.token_hex(16), key_id, version, self._clock.monotonic())
        self._sessions[session.id] = session
        return session

    def use(self, session_id: str, key_id: str | None) -> ClientSession | None:
        """The live session of that id opened by that key, marked used; else None."""
        self._sweep()
        session = self._sessions.get(session_id)
        if session is None or session.key_id != key_id:
            return None
        session.last_used = self._clock.monotonic()
        del self._sessions[session_id]
        self._sessions[session_id] = session  # to the back: the newest use
        return session

    def end(self, session_id: str) -> bool:
        if self._sessions.pop(session_id, None) is None:
            return False
        self._on_end(session_id)
        return True

    def _sweep(self) -> None:
        """End the sessions idle past the bound (they sit at the front)."""
        horizon = self._clock.monotonic() - self.idle
        sessions = self._sessions
        while sessions:
            oldest = next(iter(sessions.values()))
            if oldest.last_used > horizon:
                return
            self.end(oldest.id)

    def close(self) -> None:
        for session_id in list(self._sessions):
            self.end(session_id)

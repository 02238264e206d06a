"""Single-flight: concurrent identical misses make one upstream call. The first becomes the
leader; the others wait (with a bound) for its answer. A leader that fails hands the turn to
the next waiter instead of releasing every one of them upstream at once."""

from __future__ import annotations

import asyncio

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline


class SingleFlight:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock  # the waiters' bound runs on it
        self._flights: dict[str, asyncio.Future[bytes | None]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def join(self, key: str) -> asyncio.Future[bytes | None] | None:
        """None: the caller leads (and must call `finish`); else the leader's answer to await."""
        flight = self._flights.get(key)
        if flight is not None and not flight.done():
            return flight
        self._flights[key] = asyncio.get_running_loop().create_future()
        return None

    def finish(self, key: str, value: bytes | None) -> None:
        """The leader's answer (None: it has none); wakes every waiter. Idempotent."""
        flight = self._flights.pop(key, None)
        if flight is not None and not flight.done():
            flight.set_result(value)

    async def wait(self, key: str, bound: float) -> tuple[bytes | None, bool]:
        """(answer, leads): the leader's answer, or None with `leads` when the caller is now
        the leader, or (None, False) when `bound` seconds passed first (the caller goes alone)."""
        clock = self._clock
        deadline = clock.monotonic() + bound
        while True:
            flight = self.join(key)
            if flight is None:
                return None, True
            if deadline <= clock.monotonic():
                return None, False
            try:
                with Deadline(clock, deadline):
                    value = await asyncio.shield(flight)  # a waiter's timeout spares the flight
            except TimeoutError:
                return None, False
            if value is not None:
                return value, False
            # The leader had no answer: the next one to get here leads.

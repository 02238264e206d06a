"""A lock-out after repeated failures, per caller: whoever guesses a secret wrong `limit`
times within `window` seconds is refused outright for the next `window` seconds, so the
guesses cost the guesser time, not the gateway work. One success clears the caller's count."""

from __future__ import annotations

from dataclasses import dataclass

from ballast.resilience.clock import SYSTEM_CLOCK, Clock

MAX_CALLERS = 10_000  # remembered at once; past it the forgotten are those whose count ended


@dataclass(slots=True)
class _Count:
    failures: int
    since: float  # monotonic time of the run's first failure
    locked_until: float = 0.0


class Lockout:
    def __init__(
        self, limit: int, window: float, clock: Clock = SYSTEM_CLOCK, most: int = MAX_CALLERS
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.most = most
        self._counts: dict[str, _Count] = {}

    def retry_after(self, caller: str) -> float:
        """Seconds until `caller` may try again; 0.0 when it may now."""
        count = self._counts.get(caller)
        if count is None:
            return 0.0
        return max(0.0, count.locked_until - self.clock.monotonic())

    def failed(self, caller: str) -> None:
        """A wrong guess by `caller`; the `limit`-th within `window` locks it out."""
        now = self.clock.monotonic()
        count = self._counts.get(caller)
        if count is None or now - count.since >= self.window:
            if len(self._counts) >= self.most:
                self._forget_ended(now)
            count = self._counts[caller] = _Count(0, now)
        count.failures += 1
        if count.failures >= self.limit:
            count.locked_until = now + self.window
            count.failures = 0
            count.since = now + self.window  # a new run starts when the lock-out ends

    def succeeded(self, caller: str) -> None:
        self._counts.pop(caller, None)

    def _forget_ended(self, now: float) -> None:
        ended = [
            caller
            for caller, count in self._counts.items()
            if count.locked_until <= now and now - count.since >= self.window
        ]
        for caller in ended:
            del self._counts[caller]
        if len(self._counts) >= self.most:  # every one still counts: keep the locked ones
            locked = {c: n for c, n in self._counts.items() if n.locked_until > now}
            self._counts = locked if len(locked) < self.most else {}

    def __len__(self) -> int:
        return len(self._counts)

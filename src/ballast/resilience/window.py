"""Outcome counts over a sliding time window: the breaker's failure rate, the retry budget's
request rate and a deployment's health all read one."""

from __future__ import annotations

import math

from ballast.resilience.clock import SYSTEM_CLOCK, Clock


class SlidingWindow:
    """Outcome counts over the last `window` seconds, kept in time buckets.

    Counts are exact to one bucket: the total covers between window - window/buckets
    and window seconds of history. Each call is O(1) amortised.
    """

    __slots__ = (
        "_calls",
        "_clock",
        "_fails",
        "_head",
        "_n",
        "_total_calls",
        "_total_fails",
        "_width",
    )

    def __init__(self, window: float = 60.0, buckets: int = 10, clock: Clock = SYSTEM_CLOCK):
        if window <= 0 or buckets < 1:
            raise ValueError("window must be > 0 and buckets >= 1")
        self._n = buckets
        self._width = window / buckets
        self._clock = clock
        self._calls = [0] * buckets
        self._fails = [0] * buckets
        self._head = self._index()
        self._total_calls = 0
        self._total_fails = 0

    def _index(self) -> int:
        return math.floor(self._clock.monotonic() / self._width)

    def _advance(self) -> None:
        idx = self._index()
        if idx == self._head:
            return
        # Zero the buckets that fell out of the window (at most all of them).
        for k in range(1, min(idx - self._head, self._n) + 1):
            slot = (self._head + k) % self._n
            self._total_calls -= self._calls[slot]
            self._total_fails -= self._fails[slot]
            self._calls[slot] = 0
            self._fails[slot] = 0
        self._head = idx

    def record(self, ok: bool) -> None:
        self._advance()
        slot = self._head % self._n
        self._calls[slot] += 1
        self._total_calls += 1
        if not ok:
            self._fails[slot] += 1
            self._total_fails += 1

    def totals(self) -> tuple[int, int]:
        """(calls, failures) within the window."""
        self._advance()
        return self._total_calls, self._total_fails

    def error_rate(self) -> float:
        calls, fails = self.totals()
        return fails / calls if calls else 0.0

    def clear(self) -> None:
        self._calls = [0] * self._n
        self._fails = [0] * self._n
        self._total_calls = 0
        self._total_fails = 0

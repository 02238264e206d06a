"""Retry budget and Retry-After: how much retrying the gateway may do, and when (the wait
between tries is `backoff.py`'s).

Retries without a budget multiply load exactly when upstreams are weakest (a retry
storm); a budget caps them at a fraction of real traffic.
"""

from __future__ import annotations

import math
import re
from datetime import UTC
from email.utils import parsedate_to_datetime

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.window import SlidingWindow

_DELTA = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")


class RetryBudget:
    """Finagle/Envoy-style budget: retries <= ratio x requests + min_per_second x window,
    both counted over the last `window` seconds (time buckets, O(1) per call).

    The floor lets low traffic still retry; the ratio bounds amplification under load.
    """

    def __init__(
        self,
        ratio: float = 0.2,
        window: float = 10.0,
        min_per_second: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if ratio < 0 or min_per_second < 0 or window <= 0:
            raise ValueError("ratio and min_per_second must be >= 0, window > 0")
        self.ratio = ratio
        self.reserve = min_per_second * window
        # Only the `calls` count of each window is used.
        self._requests = SlidingWindow(window, 10, clock)
        self._retries = SlidingWindow(window, 10, clock)

    def record_request(self) -> None:
        """An original (not retried) request: deposits `ratio` of a retry."""
        self._requests.record(True)

    def try_withdraw(self) -> bool:
        """Take one retry from the budget; False means do not retry."""
        requests, _ = self._requests.totals()
        retries, _ = self._retries.totals()
        if retries + 1 > self.ratio * requests + self.reserve:
            return False
        self._retries.record(True)
        return True

    def available(self) -> float:
        requests, _ = self._requests.totals()
        retries, _ = self._retries.totals()
        return max(0.0, self.ratio * requests + self.reserve - retries)


def parse_retry_after(value: str | None, clock: Clock = SYSTEM_CLOCK) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds (fractions allowed, as in
    retry-after-ms converted to seconds) or an HTTP-date. None if absent or invalid;
    a date in the past gives 0."""
    if value is None:
        return None
    match = _DELTA.fullmatch(value)
    if match is not None:
        seconds = float(match.group(1))
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" means UTC with unknown origin
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - clock.time())

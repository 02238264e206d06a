"""Backoff: how long to wait before the next try of something that keeps failing. One formula
for every caller (the attempt loop's retries, the spend flush, a run handle that could not
be made, a job's status polls), each with its own parameters."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and jitter: the wait after `attempt` earlier ones (from
    0) is drawn uniformly from [ceiling x (1 - jitter), ceiling], where
    ceiling = min(cap, base x factor^attempt).

    Jitter 1 (the default) is full jitter, uniform(0, ceiling): it spreads synchronized
    retriers apart instead of moving the herd. A smaller jitter keeps a floor under the
    wait (a poll that must not come much sooner than asked); 0 is none (the wait is also
    told to a client as its Retry-After)."""

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("a backoff's base and cap must be >= 0")
        if self.factor < 1:
            raise ValueError("a backoff's factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("a backoff's jitter must be between 0 and 1")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after `attempt` earlier ones."""
        try:
            grown = self.base * self.factor ** max(0, attempt)
        except OverflowError:
            return self.cap
        return min(self.cap, grown)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A wait after `attempt` earlier ones; `rng` is needed unless jitter is 0."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        if rng is None:
            raise ValueError("a jittered backoff needs a random source")
        return rng.uniform(ceiling * (1.0 - self.jitter), ceiling)

"""Per-deployment health scores and the choice of which deployment to try first.

Everything here is I/O-free and driven by an injectable clock, so routing decisions
are deterministic in tests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.window import SlidingWindow

T = TypeVar("T")

# How strongly errors push a deployment down the list: cost x (1 + 10 x error rate), so
# 10 % errors doubles its cost. Failures that return fast must not look attractive.
ERROR_PENALTY = 10.0
# Latency assumed when nothing at all is known; only its ratio to others matters.
NEUTRAL_LATENCY = 1.0
_TTFT_SAMPLES = 64
STRATEGIES = frozenset({"health", "ordered", "weighted"})


class _PeakEwma:
    """Peak-sensitive moving average: jumps up at once, decays down with exp(-dt/decay)."""

    __slots__ = ("at", "decay", "value")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.value: float | None = None
        self.at = 0.0  # when the last sample came

    def update(self, sample: float, now: float, lower: bool = True) -> None:
        if self.value is None or sample > self.value:
            self.value = sample
        elif lower:
            w = math.exp(-max(0.0, now - self.at) / self.decay)
            self.value = self.value * w + sample * (1.0 - w)
        self.at = now

    def seed(self, value: float, now: float) -> None:
        self.value = value
        self.at = now


class DeploymentHealth:
    """What the router knows about one deployment: outcomes, latency, TTFT, load."""

    def __init__(
        self,
        deployment_id: str,
        clock: Clock = SYSTEM_CLOCK,
        window: float = 60.0,
        decay: float = 10.0,
    ) -> None:
        self.deployment_id = deployment_id
        self._clock = clock
        self.window = SlidingWindow(window, 10, clock)
        self._latency = _PeakEwma(decay)
        self._ttft = _PeakEwma(decay)
        self._ttft_ring: list[float] = []
        self._ttft_pos = 0
        self.in_flight = 0
        self.last_finish = -math.inf  # when a request on it last ended with a verdict

    @property
    def latency(self) -> float | None:
        """Peak-EWMA latency in seconds; None before any sample or seed."""
        return self._latency.value

    @property
    def ttft(self) -> float | None:
        return self._ttft.value

    def errors(self) -> int:
        """Failures in the health window."""
        return self.window.totals()[1]

    def now(self) -> float:
        return self._clock.monotonic()

    def stale(self, now: float) -> bool:
        """Its latency is older than the average's decay, it had no errors in the window and
        nothing is in flight: worth one request to learn where it stands. Without this, a
        deployment that once looked slower (or was out, then recovered) would never be
        tried again by a cost comparison it always loses."""
        latency = self._latency
        return (
            latency.value is not None
            and now - latency.at > latency.decay
            and self.in_flight == 0
            and self.window.totals()[1] == 0
        )

    def start(self) -> None:
        self.in_flight += 1

    def abandon(self) -> None:
        """The request ended without a verdict (e.g. the client went away)."""
        self.in_flight = max(0, self.in_flight - 1)

    def finish(self, ok: bool, latency: float | None = None, ttft: float | None = None) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.window.record(ok)
        now = self._clock.monotonic()
        self.last_finish = now
        if latency is not None:
            # A fast failure must not make a broken deployment look quick.
            self._latency.update(latency, now, lower=ok)
        if ttft is not None:
            self._ttft.update(ttft, now, lower=ok)
            if ok:
                self._add_ttft(ttft)

    def _add_ttft(self, ttft: float) -> None:
        if len(self._ttft_ring) < _TTFT_SAMPLES:
            self._ttft_ring.append(ttft)
        else:
            self._ttft_ring[self._ttft_pos] = ttft
            self._ttft_pos = (self._ttft_pos + 1) % _TTFT_SAMPLES

    def seed(self, latency: float | None, ttft: float | None = None) -> None:
        """Start a new or recovered deployment from the group's average, not from zero
        (a zero would flood it with traffic)."""
        now = self._clock.monotonic()
        if latency is not None:
            self._latency.seed(latency, now)
        if ttft is not None:
            self._ttft.seed(ttft, now)

    def error_rate(self) -> float:
        return self.window.error_rate()

    def cost(self, fallback_latency: float | None = None) -> float:
        """latency x (in_flight + 1) x (1 + ERROR_PENALTY x error_rate); lower is better.

        Latency is the peak EWMA, or `fallback_latency` (else NEUTRAL_LATENCY) when
        there is no sample yet. The in-flight factor spreads load before latency
        reacts; the error factor pushes failing deployments back.
        """
        lat = self._latency.value
        if lat is None:
            lat = NEUTRAL_LATENCY if fallback_latency is None else fallback_latency
        return lat * (self.in_flight + 1) * (1.0 + ERROR_PENALTY * self.error_rate())

    def p95_ttft(self) -> float | None:
        """95th percentile (nearest rank) of the last 64 successful TTFTs, for hedging."""
        if not self._ttft_ring:
            return None
        ordered = sorted(self._ttft_ring)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

    def snapshot(self) -> dict[str, Any]:
        calls, failures = self.window.totals()
        return {
            "deployment_id": self.deployment_id,
            "calls": calls,
            "failures": failures,
            "error_rate": failures / calls if calls else 0.0,
            "latency": self.latency,
            "ttft": self.ttft,
            "p95_ttft": self.p95_ttft(),
            "in_flight": self.in_flight,
            "cost": self.cost(),
        }


def choose(
    candidates: Sequence[T],
    strategy: str,
    health: Callable[[T], DeploymentHealth],
    weight: Callable[[T], float],
    rng: random.Random,
) -> list[T]:
    """All candidates, most preferred first; the router tries them in this order.

    "health": power of two choices on cost for the first pick, the rest by ascending
    cost. "ordered": configuration order (priority failover). "weighted": weighted
    random without replacement; weight 0 goes last, in configuration order.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown routing strategy {strategy!r}")
    items = list(candidates)
    if strategy == "ordered" or len(items) <= 1:
        return items
    if strategy == "weighted":
        return _weighted(items, weight, rng)
    return _by_health(items, health, rng)


def _weighted(items: list[T], weight: Callable[[T], float], rng: random.Random) -> list[T]:
    # Efraimidis-Spirakis: sort by Exp(1)/w; equivalent to drawing one by one by weight.
    keyed: list[tuple[float, int, T]] = []
    zero: list[T] = []
    for i, item in enumerate(items):
        w = weight(item)
        if w > 0 and math.isfinite(w):
            keyed.append((rng.expovariate(1.0) / w, i, item))
        else:
            zero.append(item)
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [item for _, _, item in keyed] + zero


def _by_health(
    items: list[T], health: Callable[[T], DeploymentHealth], rng: random.Random
) -> list[T]:
    states = [health(item) for item in items]
    now = states[0].now()
    for k, state in enumerate(states):
        if state.stale(now):  # explore it once, then the costs decide again
            return [items[k]] + [item for n, item in enumerate(items) if n != k]
    known = [h.latency for h in states if h.latency is not None]
    # No sample yet counts as average, not zero, so a new deployment is not flooded.
    fallback = sum(known) / len(known) if known else NEUTRAL_LATENCY
    costs = [h.cost(fallback) for h in states]
    i, j = rng.sample(range(len(items)), 2)
    first = j if costs[j] < costs[i] else i
    rest = sorted((k for k in range(len(items)) if k != first), key=lambda k: (costs[k], k))
    return [items[first]] + [items[k] for k in rest]

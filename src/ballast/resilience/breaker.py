"""The one circuit breaker in Ballast: upstream deployments, Redis, the database, GPU jobs.

Decisions are synchronous and I/O-free, so an open breaker fails in zero time. A
half-open probe holds a lease that frees itself after `probe_timeout`: a probe that
never gets a verdict must not block recovery for hours.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.deadline import Deadline
from ballast.resilience.window import SlidingWindow

T = TypeVar("T")
log = logging.getLogger(__name__)


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int = 5
    failure_rate: float | None = 0.5
    window: float = 30.0
    # Fewer calls make the rate noise: a deployment that fails 30 % at random opened the
    # breaker within its first 150 calls about once in 30 at 20, once in 150 at 50.
    min_calls: int = 50
    open_time: float = 5.0
    open_multiplier: float = 2.0
    max_open_time: float = 300.0
    half_open_probes: int = 1
    probe_timeout: float = 10.0
    early_probe_interval: float = 1.0  # see CircuitBreaker.early_probe

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.half_open_probes < 1 or self.min_calls < 1:
            raise ValueError("failure_threshold, half_open_probes and min_calls must be >= 1")
        if self.failure_rate is not None and not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be in [0, 1] or None")
        if min(self.window, self.open_time, self.max_open_time, self.probe_timeout) <= 0:
            raise ValueError("window, open_time, max_open_time, probe_timeout must be > 0")
        if self.open_multiplier < 1.0:
            raise ValueError("open_multiplier must be >= 1")


DEFAULT_CONFIG = BreakerConfig()


class Permit:
    """Proof that a call was admitted; hand it back with a verdict or `release`."""

    __slots__ = ("expires_at", "probe")

    def __init__(self, probe: bool, expires_at: float) -> None:
        self.probe = probe
        self.expires_at = expires_at

    def __repr__(self) -> str:
        return f"Permit(probe={self.probe}, expires_at={self.expires_at})"


class BreakerOpenError(Exception):
    """Raised by `CircuitBreaker.call` when the breaker refuses without trying."""

    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(f"circuit {name!r} is open; retry in {retry_after:.3f}s")
        self.name = name
        self.retry_after = retry_after


_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN


class CircuitBreaker:
    """CLOSED -> OPEN on N consecutive failures or a high failure rate; OPEN -> HALF_OPEN
    after the open time; a probe success closes it, a probe failure reopens it for
    longer (geometric growth up to `max_open_time`, reset by a full recovery)."""

    def __init__(
        self,
        name: str,
        config: BreakerConfig = DEFAULT_CONFIG,
        clock: Clock = SYSTEM_CLOCK,
        on_transition: Callable[[str, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self.on_transition = on_transition  # told of every change of state
        self._state = _CLOSED
        self._consecutive = 0
        self._window = (
            SlidingWindow(config.window, 10, clock) if config.failure_rate is not None else None
        )
        self._open_until = 0.0
        self._next_open_time = config.open_time
        self._probes: list[Permit] = []
        # One shared permit per closed period: admitting in CLOSED allocates nothing,
        # and verdicts from an earlier closed period are recognised as stale.
        self._closed_permit = Permit(False, math.inf)
        self.opened_count = 0
        self._early: Permit | None = None
        self._last_early = -math.inf

    # -- state -------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        if self._state is _OPEN and self._clock.monotonic() >= self._open_until:
            self._set_state(_HALF_OPEN)
        return self._state

    def _set_state(self, new: BreakerState) -> None:
        old = self._state
        if old is new:
            return
        self._state = new
        self._probes.clear()
        if new is _OPEN:
            self.opened_count += 1
        elif new is _CLOSED:
            self._consecutive = 0
            self._next_open_time = self.config.open_time
            self._closed_permit = Permit(False, math.inf)
            if self._window is not None:
                self._window.clear()
        if self.on_transition is not None:
            try:
                self.on_transition(self.name, old, new)
            except Exception:
                log.exception("breaker %s: transition callback failed", self.name)

    def _open(self, now: float, duration: float, retry_after: float | None) -> None:
        if retry_after is not None and retry_after > 0:
            # Honour Retry-After, but never beyond the cap: a bogus huge value must not
            # disable a deployment for days.
            duration = max(duration, min(retry_after, self.config.max_open_time))
        self._open_until = now + duration
        self._set_state(_OPEN)

    # -- admission ---------------------------------------------------------------

    def acquire(self) -> Permit | None:
        """A permit to try the call now, or None to fail fast without I/O."""
        if self._state is _CLOSED:
            return self._closed_permit
        if self.state is _OPEN:
            return None
        now = self._clock.monotonic()
        self._prune(now)
        if len(self._probes) >= self.config.half_open_probes:
            return None
        permit = Permit(True, now + self.config.probe_timeout)
        self._probes.append(permit)
        return permit

    def _prune(self, now: float) -> None:
        if self._probes:
            self._probes = [p for p in self._probes if p.expires_at > now]

    def _take_probe(self, permit: Permit, now: float) -> bool:
        """Remove a probe's lease; True if it was live (its verdict counts)."""
        for i, held in enumerate(self._probes):
            if held is permit:
                del self._probes[i]
                return permit.expires_at > now
        return False

    # -- verdicts ----------------------------------------------------------------

    def early_probe(self) -> Permit | None:
        """A probe before the open time is up, for when every alternative is open too: the
        caller has nothing else to try (Envoy's panic routing, bounded to one probe at a time
        and one per `early_probe_interval`). A success closes the breaker at once, so a
        deployment that recovered is not kept out for the rest of a long open time; a
        failure keeps it open without growing the open time."""
        if self.state is not _OPEN:
            return None
        now = self._clock.monotonic()
        early = self._early
        if early is not None and early.expires_at > now:
            return None
        if now - self._last_early < self.config.early_probe_interval:
            return None
        self._last_early = now
        self._early = Permit(True, now + self.config.probe_timeout)
        return self._early

    def _settle_early(self, permit: Permit, ok: bool) -> bool:
        """Handle an early probe's verdict; False when `permit` is not the early probe."""
        if permit is not self._early:
            return False
        self._early = None
        if ok and permit.expires_at > self._clock.monotonic() and self._state is _OPEN:
            self._set_state(_CLOSED)
        return True

    def record_success(self, permit: Permit) -> None:
        """The call worked. A live probe's success closes the breaker."""
        if self._settle_early(permit, True):
            return
        if permit is self._closed_permit:
            if self._state is _CLOSED:
                self._consecutive = 0
                if self._window is not None:
                    self._window.record(True)
            return
        if permit.probe and self._take_probe(permit, self._clock.monotonic()):
            self._set_state(_CLOSED)

    def record_failure(self, permit: Permit, retry_after: float | None = None) -> None:
        """The call failed. `retry_after` (the upstream's Retry-After) sets a minimum open
        time if this opens the breaker, or extends an open one; alone it does not open."""
        if self._settle_early(permit, False):
            return
        now = self._clock.monotonic()
        if permit.probe:
            if self._take_probe(permit, now):
                self._next_open_time = min(
                    self.config.max_open_time, self._next_open_time * self.config.open_multiplier
                )
                self._open(now, self._next_open_time, retry_after)
                return
        elif permit is self._closed_permit and self._state is _CLOSED:
            self._consecutive += 1
            if self._window is not None:
                self._window.record(False)
            if self._consecutive >= self.config.failure_threshold or self._rate_tripped():
                self._open(now, self._next_open_time, retry_after)
            return
        # Late failure while cooling down: extend the cooldown if the upstream asked.
        if (
            retry_after is not None
            and permit.expires_at > now
            and self.state is _OPEN
            and (permit.probe or permit is self._closed_permit)
        ):
            until = now + min(retry_after, self.config.max_open_time)
            self._open_until = max(self._open_until, until)

    def count_failure(self) -> bool:
        """A failure seen elsewhere (another worker or instance) counts toward the threshold
        like one of ours, so a dead deployment opens every breaker of a fleet after
        `failure_threshold` failures in all; a success of our own still resets the count.
        True when this opened the breaker."""
        if self._state is not _CLOSED:
            return False
        self._consecutive += 1
        if self._consecutive < self.config.failure_threshold:
            return False
        self._open(self._clock.monotonic(), self._next_open_time, None)
        return True

    def _rate_tripped(self) -> bool:
        rate = self.config.failure_rate
        if rate is None or self._window is None:
            return False
        calls, failures = self._window.totals()
        return calls >= self.config.min_calls and failures > rate * calls

    def hold(self, permit: Permit, until: float) -> None:
        """Keep a live probe's lease until `until`: a stream that answered is no stuck probe,
        and its verdict, given when it ends, must still count. The stream's own clocks and
        deadline bound how long that is."""
        now = self._clock.monotonic()
        if permit.probe and permit.expires_at > now and until > permit.expires_at:
            if permit is self._early or any(held is permit for held in self._probes):
                permit.expires_at = until

    def release(self, permit: Permit) -> None:
        """No verdict (e.g. the client went away): free a probe slot without judging."""
        if self._settle_early(permit, False):
            return
        if permit.probe:
            self._take_probe(permit, self._clock.monotonic())

    # -- manual control ----------------------------------------------------------

    def force_open(self, duration: float) -> None:
        """Open for at least `duration` seconds (429 cooldown, drain); never shortens."""
        now = self._clock.monotonic()
        until = now + max(0.0, duration)
        if self.state is _OPEN:
            self._open_until = max(self._open_until, until)
        else:
            self._open_until = until
            self._set_state(_OPEN)

    def reset(self) -> None:
        """Back to CLOSED with no history (an operator's "it is fixed")."""
        self._set_state(_CLOSED)
        self._consecutive = 0
        self._open_until = 0.0
        self._next_open_time = self.config.open_time
        if self._window is not None:
            self._window.clear()

    def retry_after(self) -> float:
        """Seconds until the breaker may admit a call; 0 when it admits now."""
        state = self.state
        if state is _CLOSED:
            return 0.0
        now = self._clock.monotonic()
        if state is _OPEN:
            return max(0.0, self._open_until - now)
        self._prune(now)
        if len(self._probes) < self.config.half_open_probes:
            return 0.0
        return max(0.0, min(p.expires_at for p in self._probes) - now)

    # -- convenience for dependencies ----------------------------------------------

    async def call(self, fn: Callable[[], Awaitable[T]], timeout: float) -> T:  # noqa: ASYNC109
        """Run `fn` under the breaker with a hard timeout (on the breaker's clock, as its
        open time is); raise BreakerOpenError at once when open. Cancellation frees the
        permit without a verdict."""
        permit = self.acquire()
        if permit is None:
            raise BreakerOpenError(self.name, self.retry_after())
        try:
            with Deadline(self._clock, self._clock.monotonic() + timeout):
                result = await fn()
        except asyncio.CancelledError:
            self.release(permit)
            raise
        except Exception:  # a timeout arrives here as TimeoutError
            self.record_failure(permit)
            raise
        self.record_success(permit)
        return result

    # -- introspection ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        state = self.state
        calls, failures = self._window.totals() if self._window is not None else (0, 0)
        now = self._clock.monotonic()
        self._prune(now)
        return {
            "name": self.name,
            "state": state.value,
            "consecutive_failures": self._consecutive,
            "window_calls": calls,
            "window_failures": failures,
            "open_until": self._open_until if state is _OPEN else None,
            "retry_after": self.retry_after(),
            "probes_in_flight": len(self._probes),
            "opened_count": self.opened_count,
        }

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self.state.value})"

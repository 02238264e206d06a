"""What a rate limit admission deals in: a key's `Limits`, the `Lease` an admitted request
holds until it is released, `RateLimited` for a refused one, and OpenAI's x-ratelimit-*
headers that go out with either.

Why a module of its own: both halves of the limiter (the local share in
`ratelimit_local.py`, Redis in `ratelimit_redis.py`) hand out the same leases and headers,
and the pipeline holds a lease without knowing which half made it.
"""

from __future__ import annotations

import functools
import math
from typing import Final, NamedTuple

WINDOW: Final = 60.0

_REASONS: Final = ("", "requests", "tokens", "parallel")


class Limits(NamedTuple):
    """A key's limits; None is not enforced, 0 refuses everything. A tuple: one is made
    for every limited request, at half the cost of a frozen dataclass."""

    key_id: str
    rpm: int | None
    tpm: int | None
    max_parallel: int | None


class RateLimited(Exception):
    """Over a limit. `headers` are the x-ratelimit-* headers; the caller adds Retry-After."""

    def __init__(self, reason: str, retry_after: float, headers: list[tuple[bytes, bytes]]):
        super().__init__(f"rate limited ({reason}); retry after {retry_after:.3f}s")
        self.reason = reason
        self.retry_after = retry_after
        self.headers = headers


_NONE: Final = 0
_LOCAL: Final = 1
_REDIS: Final = 2
_SHARED: Final = 3  # the windows every worker of the machine shares (ratelimit_shm.py)


class Lease:
    """An admitted request. Hand it back with `RateLimiter.release` exactly once (a second
    release is ignored). `headers` are OpenAI's x-ratelimit-* headers for the response,
    built when it is admitted: every admitted request sends them."""

    __slots__ = (
        "_kind",
        "_lease_id",
        "_local",
        "_window",
        "estimated",
        "headers",
        "key_id",
        "released",
    )

    def __init__(
        self,
        kind: int,
        key_id: str,
        estimated: int,
        window: int,
        lease_id: str,
        headers: list[tuple[bytes, bytes]],
        local: _LocalKey | None = None,
    ) -> None:
        self._kind = kind
        self.key_id = key_id
        self.estimated = estimated
        self._window = window
        self._lease_id = lease_id
        self.headers = headers
        self._local = local
        self.released = False

    @property
    def shared(self) -> bool:
        """True when Redis admitted it (the limit is shared by all instances)."""
        return self._kind == _REDIS


class _LocalKey:
    """One key's local windows (seconds on the monotonic clock) and parallel count."""

    __slots__ = ("inflight", "rc", "rp", "tc", "tp", "window")

    def __init__(self) -> None:
        self.window = -2
        self.rc = self.rp = self.tc = self.tp = 0
        self.inflight = 0


def _headers(
    rpm: int | None, tpm: int | None, into: float, rc: int, rp: int, tc: int, tp: int
) -> list[tuple[bytes, bytes]]:
    """OpenAI's x-ratelimit-* headers. `reset` is the time until the window is back to
    its initial state (all usage aged out), as OpenAI defines it. Built for every limited
    response, so the two resets are formatted once when they agree (they usually do)."""
    out: list[tuple[bytes, bytes]] = []
    weight = (WINDOW - into) / WINDOW
    seconds = -1.0
    reset = b""
    if rpm is not None:
        seconds = _reset_seconds(rc, rp, into)
        reset = reset_header(seconds)
        out.append((b"x-ratelimit-limit-requests", b"%d" % rpm))
        out.append((b"x-ratelimit-remaining-requests", _remaining(rpm, rp * weight + rc)))
        out.append((b"x-ratelimit-reset-requests", reset))
    if tpm is not None:
        token_seconds = _reset_seconds(tc, tp, into)
        if token_seconds != seconds:
            reset = reset_header(token_seconds)
        out.append((b"x-ratelimit-limit-tokens", b"%d" % tpm))
        out.append((b"x-ratelimit-remaining-tokens", _remaining(tpm, tp * weight + tc)))
        out.append((b"x-ratelimit-reset-tokens", reset))
    return out


def _remaining(limit: int, used: float) -> bytes:
    return b"%d" % max(0, math.floor(limit - used + 1e-9))


def _reset_seconds(current: int, previous: int, into: float) -> float:
    if current > 0:
        return 2 * WINDOW - into
    if previous > 0:
        return WINDOW - into
    return 0.0


def reset_header(seconds: float) -> bytes:
    """A reset header's value: OpenAI's (Go-style) durations, "0s", "250ms", "1.5s",
    "1m30s", "2m0s", rounded up to the millisecond."""
    return _duration(math.ceil(seconds * 1000 - 1e-6))


@functools.lru_cache(maxsize=1024)
def _duration(ms: int) -> bytes:
    """Cached: at thousands of requests a second, several in a row share their millisecond
    (and a window's resets repeat), so most are a lookup rather than a float formatted and
    trimmed."""
    if ms <= 0:
        return b"0s"
    if ms < 1000:
        return b"%dms" % ms
    if ms < 60_000:
        return f"{ms / 1000:.3f}".rstrip("0").rstrip(".").encode() + b"s"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s".encode()

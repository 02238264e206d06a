"""Where requests and router events are observed: metrics, log lines, the recent-events ring
the dashboard polls, and each deployment's traffic over the last minutes. Every reading is of
the app's clock, so a test that moves the clock sees the latencies and timestamps it made."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ballast.observe.logs import access_logged, log_event, log_request
from ballast.observe.metrics import Metrics
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.types import Message, Send

# Events worth a log line and a place on the dashboard; "retry" is only counted.
NOTABLE = frozenset(
    {"failover", "breaker", "heal", "continuation", "hedge", "fallback", "cooldown", "reload"}
)
# The event that ends a broken stream: OpenAI's, and the typed one of other shapes.
_ERROR_EVENTS = (b'data: {"error"', b"event: error\n")


class Trace:
    """One client request as the client saw it: wraps `send` to note the status, the time of
    the first byte of the answer and whether a stream ended with an error event; `now` is
    the clock's monotonic reading."""

    __slots__ = (
        "_now",
        "_send",
        "deployment",
        "first",
        "request_id",
        "started",
        "status",
        "stream_error",
        "streaming",
    )

    def __init__(self, send: Send, now: Callable[[], float]) -> None:
        self._send = send
        self._now = now
        self.started = now()
        self.status = 0
        self.first = 0.0
        self.streaming = False
        self.stream_error = False
        self.deployment: str | None = None
        self.request_id = ""

    def send(self, message: Message) -> Awaitable[None]:
        """The server's `send`, after a look at the message (no coroutine of its own)."""
        kind = message["type"]
        if kind == "http.response.body":
            if self.streaming:
                body = message.get("body", b"")
                if not self.first and body:
                    self.first = self._now()
                elif body.startswith(_ERROR_EVENTS):
                    self.stream_error = True
        elif kind == "http.response.start":
            self.status = message["status"]
            for key, value in message["headers"]:
                if key == b"x-request-id":
                    self.request_id = value.decode("latin-1")
                elif key == b"x-ballast-deployment":
                    self.deployment = value.decode("latin-1")
                    self.streaming = True
        return self._send(message)


class Traffic:
    """Requests per deployment in 10-second buckets over the last five minutes."""

    BUCKET = 10.0
    BUCKETS = 30

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counts: dict[str, list[int]] = {}
        self._epochs: dict[str, list[int]] = {}

    def add(self, deployment: str) -> None:
        epoch = int(self._clock() // self.BUCKET)
        slot = epoch % self.BUCKETS
        counts = self._counts.get(deployment)
        if counts is None:
            counts = self._counts[deployment] = [0] * self.BUCKETS
            self._epochs[deployment] = [-1] * self.BUCKETS
        epochs = self._epochs[deployment]
        if epochs[slot] != epoch:
            epochs[slot] = epoch
            counts[slot] = 0
        counts[slot] += 1

    def series(self, deployment: str) -> list[int]:
        """Oldest first, one number per bucket, the current (partial) bucket last."""
        now = int(self._clock() // self.BUCKET)
        counts = self._counts.get(deployment)
        if counts is None:
            return [0] * self.BUCKETS
        epochs = self._epochs[deployment]
        out = []
        for epoch in range(now - self.BUCKETS + 1, now + 1):
            slot = epoch % self.BUCKETS
            out.append(counts[slot] if epochs[slot] == epoch else 0)
        return out


class Observer:
    def __init__(
        self,
        targets: Callable[[], Iterable[Any]],
        clock: Clock = SYSTEM_CLOCK,
        ring_size: int = 500,
    ) -> None:
        self.monotonic = clock.monotonic  # request latencies (a Trace reads it too)
        self._time = clock.time  # event timestamps
        self.metrics = Metrics(targets)
        self.traffic = Traffic(clock.time)
        self.events: deque[dict[str, Any]] = deque(maxlen=ring_size)
        self._seq = itertools.count(1)
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    # -- router events -----------------------------------------------------------------

    def on_event(self, name: str, fields: dict[str, Any]) -> None:
        self.metrics.event(name, fields)
        if name in NOTABLE:
            self.note(name, fields)
        for listener in self.listeners:
            listener(name, fields)

    def note(self, name: str, fields: dict[str, Any]) -> None:
        """Remember and log a notable event."""
        self.events.append({"seq": next(self._seq), "ts": self._time(), "event": name, **fields})
        level = logging.INFO
        if name == "breaker" and fields.get("to") == "open":
            level = logging.WARNING
        log_event(name, fields, level)

    def recent(self, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.events if e["seq"] > since]

    # -- client requests ---------------------------------------------------------------

    def request(self, trace: Trace, request: Any, router: Any, path: str) -> None:
        """A client request ended (called once per request, after the last byte)."""
        now = self.monotonic()
        latency = now - trace.started
        status = trace.status or 499
        model = "unknown"
        deployment = trace.deployment
        attempts = 0
        stream = False
        shape = "openai"
        if request is not None:
            stream = request.stream
            shape = request.shape
            group = request.group
            if group is not None:
                model = group.name
            tried = request.attempts
            if tried is not None:
                attempts = tried.count
                if deployment is None:
                    deployment = tried.deployment
        if deployment is None:
            deployment = "none"
        if not trace.status:
            outcome = "cancelled"
        elif trace.stream_error:
            outcome = "stream_error"
        elif status < 400:
            outcome = "ok" if attempts <= 1 else "recovered"
        elif status < 500:
            outcome = "rejected"
        else:
            outcome = "failed"
        ttft = trace.first - trace.started if trace.first else None
        self.metrics.request(model, deployment, status, outcome, latency, ttft, attempts)
        if deployment != "none":
            self.traffic.add(deployment)
        if access_logged():
            log_request(
                {
                    "request_id": trace.request_id,
                    "path": path,
                    "shape": shape,
                    "model": model,
                    "deployment": deployment,
                    "stream": stream,
                    "status": status,
                    "outcome": outcome,
                    "latency_ms": round(latency * 1000, 2),
                    "ttft_ms": round(ttft * 1000, 2) if ttft is not None else None,
                    "attempts": attempts,
                }
            )

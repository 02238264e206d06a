"""Where requests and router events are observed: metrics, log lines, the recent-events ring
the dashboard polls, and each deployment's traffic over the last minutes. Every reading is of
the app's clock, so a test that moves the clock sees the latencies and timestamps it made."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ballast.config import ObserveSettings
from ballast.observe.answer import Answer, CostOf, answer_fields, key_fields
from ballast.observe.logs import access_logged, log_event, log_request
from ballast.observe.metrics import Metrics
from ballast.resilience.clock import SYSTEM_CLOCK, Clock

# Events worth a log line and a place on the dashboard; "retry" is only counted.
NOTABLE = frozenset(
    {"failover", "breaker", "heal", "continuation", "hedge", "fallback", "cooldown", "reload"}
)


class Traced(Protocol):
    """What the request log and metrics read of a response when its request ended (the
    pipeline's Responder notes it as the response goes out)."""

    began: float  # the clock's monotonic reading when the request came in
    status: int  # 0: no response went out
    first: float  # when a stream's first event went out; 0: none did
    stream_error: bool  # a stream ended with an error event
    deployment: str | None  # the deployment a stream came from
    request_id: str
    error_code: str | None  # the code of the error Ballast answered with, if it did


class Traffic:
    """Requests per deployment in 10-second buckets over the last five minutes."""

    BUCKET = 10.0
    BUCKETS = 30

    def __init__(self, clock: Callable[[], float] = SYSTEM_CLOCK.time) -> None:
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
        recent_requests: int = 500,
    ) -> None:
        self.monotonic = clock.monotonic  # request latencies (a Responder reads it too)
        self._time = clock.time  # event timestamps
        self.metrics = Metrics(targets, clock)
        self.traffic = Traffic(clock.time)
        self.events: deque[dict[str, Any]] = deque(maxlen=ring_size)
        self._seq = itertools.count(1)
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        # Recent failed requests with their cause, for the dashboard.
        self.failures: deque[dict[str, Any]] = deque(maxlen=100)
        # The last requests' metadata (never a body), for the admin UI; 0 keeps none.
        self.requests: deque[tuple[Any, ...]] | None = (
            deque(maxlen=recent_requests) if recent_requests > 0 else None
        )
        self._key_labels: set[str] = set()
        # Dollars left in a key's budget as far as known without a query (set at start-up).
        self.budget_left: Callable[[Any], float | None] | None = None
        # The gateway's pricing (the spend records' own), set where the app is assembled.
        self.cost_of_answer: CostOf | None = None

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

    def request(
        self,
        trace: Traced,
        request: Any,
        router: Any,
        path: str,
        client_gone: bool = False,
        key: Any = None,
        client_path: str | None = None,
    ) -> None:
        """A client request ended (called once per request, after the last byte). `path` is
        the upstream API the route speaks; `client_path` the one the client called; `key`
        the key authentication found (a refused request has one, and no ticket)."""
        now = self.monotonic()
        latency = now - trace.began
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
        outcome = outcome_of(trace, status, attempts, client_gone)
        ttft = trace.first - trace.began if trace.first else None
        self.metrics.request(model, deployment, status, outcome, latency, ttft, attempts, shape)
        if request is not None and request.dropped:
            self.metrics.dropped(shape, request.dropped)
        if deployment != "none":
            self.traffic.add(deployment)
        answer = None
        if request is not None and request.group is not None:
            answer = self._account(request, router, model, deployment, path)
        if outcome not in _GOOD_OUTCOMES:
            self._failure(trace, request, model, deployment, status, outcome)
        if key is None:
            key = _ticket_key(request)
        if self.requests is not None:  # a tuple now; a dict only when someone reads
            self.requests.append(
                (
                    self._time(),
                    trace.request_id,
                    client_path or path,
                    key,
                    model,
                    deployment,
                    status,
                    trace.error_code,
                    latency,
                    answer,
                )
            )
        if access_logged():
            fields = {
                "request_id": trace.request_id,
                "path": client_path or path,
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
            if trace.error_code is not None:
                fields["error_code"] = trace.error_code
            key_fields(key, fields)
            if request is not None:
                fields.update(answer_fields(request, router, deployment, answer))
            log_request(fields)

    def recent_requests(self, limit: int) -> list[dict[str, Any]]:
        """The last requests' metadata (who, what, how it went; never a body), newest first."""
        if self.requests is None:
            return []
        rows = []
        for (
            ts,
            request_id,
            path,
            key,
            model,
            deployment,
            status,
            code,
            latency,
            answer,
        ) in itertools.islice(reversed(self.requests), limit):
            reported = answer is not None and answer.reported
            rows.append(
                {
                    "ts": ts,
                    "request_id": request_id,
                    "path": path[:200],
                    "key_id": key.id if key is not None else None,
                    "key_name": key.name if key is not None else None,
                    "team_id": key.team_id if key is not None else None,
                    "model": model,
                    "deployment": deployment,
                    "status": status,
                    "error_code": code,
                    "latency_ms": round(latency * 1000, 2),
                    "input_tokens": answer.usage.prompt if reported else None,
                    "output_tokens": answer.usage.completion if reported else None,
                    "cost": answer.cost if reported else None,
                }
            )
        return rows

    def _account(self, request: Any, router: Any, model: str, deployment: str, path: str) -> Answer:
        """Tokens, dollars, cache result and budget of one request, into the metrics."""
        answer = Answer.of(request, router, deployment, self.cost_of_answer)
        stats = self.metrics.stats
        lookup = request.lookup
        if lookup is not None:
            stats.record_cache(model, lookup.status.decode("latin-1"))
        key_label = self.key_label(
            answer.key_id, router.settings.observe if router is not None else None
        )
        if answer.reported:
            stats.record_usage(
                (model, deployment, answer.provider, answer.shape, key_label),
                _OPERATIONS.get(path, "chat"),
                answer.usage,
                answer.cost,
            )
        ticket = request.ticket
        if ticket is not None and ticket.key.budget is not None and self.budget_left is not None:
            left = self.budget_left(ticket.key)
            if left is not None and key_label not in (OTHER_KEY, ALL_KEYS):
                stats.record_budget(key_label, left)
        return answer

    def key_label(self, key_id: str, settings: ObserveSettings | None) -> str:
        """The key id as a label: every key while `observe.per_key_metrics` is on and fewer
        than `observe.max_key_series` were seen, then `other`; `all` when it is off."""
        if settings is None or not settings.per_key_metrics:
            return ALL_KEYS
        labels = self._key_labels
        if key_id in labels:
            return key_id
        if len(labels) >= settings.max_key_series:
            return OTHER_KEY
        labels.add(key_id)
        return key_id

    def _failure(
        self, trace: Traced, request: Any, model: str, deployment: str, status: int, outcome: str
    ) -> None:
        """A failed request on the dashboard's failure log, with its cause."""
        cause = None
        tried = request.attempts if request is not None else None
        if tried is not None:
            last = tried.last_failure()
            if last is not None:
                cause = last.kind.label
        self.failures.append(
            {
                "ts": self._time(),
                "request_id": trace.request_id,
                "model": model,
                "deployment": deployment,
                "status": status,
                "outcome": outcome,
                "cause": cause or outcome,
            }
        )


_GOOD_OUTCOMES = frozenset({"ok", "recovered", "rejected"})
OTHER_KEY = "other"
ALL_KEYS = "all"
_OPERATIONS = {
    "/chat/completions": "chat",
    "/completions": "text_completion",
    "/embeddings": "embeddings",
    "/messages": "chat",
    "/responses": "chat",
}


def _ticket_key(request: Any) -> Any:
    ticket = request.ticket if request is not None else None
    return ticket.key if ticket is not None else None


def outcome_of(trace: Traced, status: int, attempts: int, client_gone: bool) -> str:
    """How a request ended, as the client saw it. A client that went away is `client_gone`,
    whatever status went out before it left."""
    if client_gone:
        return "client_gone"
    if not trace.status:
        return "cancelled"
    if trace.stream_error:
        return "stream_error"
    if status < 400:
        return "ok" if attempts <= 1 else "recovered"
    if status < 500:
        return "rejected"
    return "failed"

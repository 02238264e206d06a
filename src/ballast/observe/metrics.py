"""Prometheus metrics. Every label set is bound once and kept in a dict, so recording a
request is a dict lookup and a few float additions (no label dicts built per request).

With `PROMETHEUS_MULTIPROC_DIR` set (`ballast serve --workers N` sets it to a fresh
directory) the counters and histograms of every worker are summed at scrape time; the
values read at scrape time (breaker state, in-flight, handle caches) are the scraping
worker's own."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BREAKER_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


class Metrics:
    """The gateway's metrics. `targets` (a callable returning the live router's targets) is
    read at scrape time for the gauges that describe current state."""

    def __init__(self, targets: Callable[[], Iterable[Any]] | None = None) -> None:
        self._multiproc = multiprocess_dir()
        # In multiprocess mode the values live in files and are collected from there; the
        # metric objects are not registered anywhere.
        self.registry = CollectorRegistry(auto_describe=False)
        reg: CollectorRegistry | None = None if self._multiproc else self.registry
        self._targets = targets
        self.requests = Counter(
            "ballast_requests",
            "Client requests by model group, deployment, status and outcome.",
            ("model", "deployment", "status", "outcome"),
            registry=reg,
        )
        self.latency = Histogram(
            "ballast_request_duration_seconds",
            "Client request latency, first byte received to last byte sent.",
            ("model", "deployment"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "ballast_time_to_first_token_seconds",
            "Streams: time from the request to the first byte of the answer sent to the client.",
            ("model", "deployment"),
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.attempts = Counter(
            "ballast_upstream_attempts",
            "Upstream attempts made for client requests (first tries, retries, continuations).",
            ("model",),
            registry=reg,
        )
        self.retries = Counter(
            "ballast_retries", "Attempts after a request's first.", ("deployment",), registry=reg
        )
        self.failovers = Counter(
            "ballast_failovers",
            "A deployment failed an attempt and the request moved on.",
            ("deployment", "reason"),
            registry=reg,
        )
        self.continuations = Counter(
            "ballast_continuations",
            "Streams broken after their first byte and continued on another deployment.",
            ("deployment", "reason"),
            registry=reg,
        )
        self.hedges = Counter(
            "ballast_hedges",
            "Second streams started because the first gave no token in time.",
            ("deployment",),
            registry=reg,
        )
        self.heals = Counter(
            "ballast_heals",
            "Requests healed by replacing a remote resource handle (e.g. 409 inactive run).",
            ("deployment", "reason"),
            registry=reg,
        )
        self.fallbacks = Counter(
            "ballast_fallbacks",
            "Requests that moved to a fallback model.",
            ("from_model", "to_model"),
            registry=reg,
        )
        self.cooldowns = Counter(
            "ballast_cooldowns",
            "Deployments cooled down after a 429 (Retry-After honoured).",
            ("deployment",),
            registry=reg,
        )
        self.breaker_transitions = Counter(
            "ballast_breaker_transitions",
            "Circuit breaker state changes.",
            ("deployment", "from_state", "to_state"),
            registry=reg,
        )
        self.breaker_state = Gauge(
            "ballast_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
            ("deployment",),
            registry=reg,
            multiprocess_mode="max",
        )
        self.reloads = Counter(
            "ballast_config_reloads", "Config reloads by result.", ("result",), registry=reg
        )
        self._request_children: dict[tuple[str, str, str, str], Any] = {}
        self._timing_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._event_children: dict[tuple[str, ...], Any] = {}
        self.registry.register(_LiveCollector(self))

    # -- hot path --------------------------------------------------------------------

    def request(
        self,
        model: str,
        deployment: str,
        status: int,
        outcome: str,
        latency: float,
        ttft: float | None,
        attempts: int,
    ) -> None:
        key = (model, deployment, str(status), outcome)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()
        timing = self._timing_children.get((model, deployment))
        if timing is None:
            timing = self._timing_children[(model, deployment)] = (
                self.latency.labels(model, deployment),
                self.ttft.labels(model, deployment),
                self.attempts.labels(model),
            )
        timing[0].observe(latency)
        if ttft is not None:
            timing[1].observe(ttft)
        if attempts:
            timing[2].inc(attempts)

    def event(self, name: str, fields: dict[str, Any]) -> None:
        """A router event (the names `Router.on_event` uses)."""
        if name == "breaker":
            dep = str(fields.get("deployment"))
            new = str(fields.get("to"))
            self._child(self.breaker_transitions, dep, str(fields.get("from")), new).inc()
            self._child(self.breaker_state, dep).set(BREAKER_VALUES.get(new, 0.0))
            return
        dep = str(fields.get("deployment", ""))
        reason = str(fields.get("reason", ""))
        if name == "retry":
            self._child(self.retries, dep).inc()
        elif name == "failover":
            self._child(self.failovers, dep, reason).inc()
        elif name == "continuation":
            self._child(self.continuations, dep, reason).inc()
        elif name == "hedge":
            self._child(self.hedges, dep).inc()
        elif name == "heal":
            self._child(self.heals, dep, reason).inc()
        elif name == "fallback":
            self._child(self.fallbacks, str(fields.get("from")), str(fields.get("to"))).inc()
        elif name == "cooldown":
            self._child(self.cooldowns, dep).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._event_children.get(key)
        if child is None:
            child = self._event_children[key] = metric.labels(*labels)
        return child

    def deployments(self, ids: Iterable[str]) -> None:
        """Create the per-deployment series at start, so a scrape shows every deployment
        (closed breakers, zero failovers) before anything happens."""
        for dep in ids:
            self._child(self.breaker_state, dep).set(0.0)

    # -- scrape ----------------------------------------------------------------------

    def render(self) -> bytes:
        source = self._targets
        for target in source() if source is not None else ():
            # The state may have moved on (open -> half-open) without any event.
            value = BREAKER_VALUES.get(target.breaker.state.value, 0.0)
            self._child(self.breaker_state, target.id).set(value)
        if self._multiproc:
            from prometheus_client import multiprocess

            registry = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(registry, self._multiproc)  # type: ignore[no-untyped-call]
            registry.register(_LiveCollector(self))
            return generate_latest(registry)
        return generate_latest(self.registry)


class _LiveCollector(Collector):
    """Values read from the running router when scraped: they cost nothing per request."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        source = self._metrics._targets
        targets = list(source()) if source is not None else []
        in_flight = GaugeMetricFamily(
            "ballast_in_flight", "Upstream attempts in flight.", labels=["deployment"]
        )
        drained = GaugeMetricFamily(
            "ballast_deployment_drained", "1 when an operator drained it.", labels=["deployment"]
        )
        error_rate = GaugeMetricFamily(
            "ballast_deployment_error_rate",
            "Failure share in the health window.",
            labels=["deployment"],
        )
        handles = GaugeMetricFamily(
            "ballast_handles_cached", "Remote resource handles cached.", labels=["deployment"]
        )
        handle_events = CounterMetricFamily(
            "ballast_handle_operations",
            "Remote resource handle operations (created, refreshed, healed, failed).",
            labels=["deployment", "operation"],
        )
        for target in targets:
            dep = target.id
            in_flight.add_metric([dep], target.health.in_flight)
            drained.add_metric([dep], 1.0 if target.drained else 0.0)
            error_rate.add_metric([dep], target.health.error_rate())
            if target.handles is not None:
                handles.add_metric([dep], len(target.handles))
                stats = target.handles.stats
                for op in ("created", "refreshed", "healed", "failed"):
                    handle_events.add_metric([dep, op], getattr(stats, op))
        yield from (in_flight, drained, error_rate, handles, handle_events)

"""Prometheus metrics. The numbers recorded for every request live in `RequestStats` (plain
counters, built into Prometheus families when scraped); the router's events (failovers,
breaker changes, retries...) use prometheus_client's metric objects, each label set bound
once and kept in a dict.

With `PROMETHEUS_MULTIPROC_DIR` set (`ballast serve --workers N` sets it to a fresh
directory) the counters and histograms of every worker are summed at scrape time; the
values read at scrape time (breaker state, in-flight, handle caches) are the scraping
worker's own."""

from __future__ import annotations

import fnmatch
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

from ballast.observe.families import StatsCollector
from ballast.observe.request_stats import RequestStats, Snapshots
from ballast.resilience.clock import SYSTEM_CLOCK, Clock

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

OTHER = "other"  # the label of every model name that is not configured

BREAKER_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


class Metrics:
    """The gateway's metrics. `targets` (a callable returning the live router's targets) is
    read at scrape time for the gauges that describe current state."""

    def __init__(
        self, targets: Callable[[], Iterable[Any]] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._multiproc = multiprocess_dir()
        # In multiprocess mode the values live in files and are collected from there; the
        # metric objects are not registered anywhere.
        self.registry = CollectorRegistry(auto_describe=False)
        reg: CollectorRegistry | None = None if self._multiproc else self.registry
        self._targets = targets
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
        self.probes = Counter(
            "ballast_probes",
            "Background probes of failing deployments, by outcome (ok, failed, auth).",
            ("deployment", "outcome"),
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
        self.clients_gone = Counter(
            "ballast_client_gone",
            "Requests dropped because the client went away (disconnect) or stopped reading"
            " its stream (write_timeout).",
            ("deployment", "reason"),
            registry=reg,
        )
        self.unpriced = Gauge(
            "ballast_deployment_unpriced",
            "1 for a deployment with no known price while some key has a budget ($0 answers).",
            ("deployment",),
            registry=reg,
            multiprocess_mode="max",
        )
        self.mcp_calls = Counter(
            "ballast_mcp_tool_calls",
            "MCP tool calls by server, tool, key and outcome (ok, tool_error, error, timeout,"
            " breaker_open, ...).",
            ("server", "tool", "key", "outcome"),
            registry=reg,
        )
        self.mcp_latency = Histogram(
            "ballast_mcp_tool_call_seconds",
            "MCP tool calls, received to answered.",
            ("server",),
            registry=reg,
        )
        self.reloads = Counter(
            "ballast_config_reloads", "Config reloads by result.", ("result",), registry=reg
        )
        self.dropped_params = Counter(
            "ballast_dropped_params",
            "Request parameters left out on the way to a deployment of another API shape.",
            ("shape", "parameter"),
            registry=reg,
        )
        self._event_children: dict[tuple[str, ...], Any] = {}
        self._models: frozenset[str] = frozenset()
        self._patterns: tuple[str, ...] = ()
        self.stats = RequestStats()
        # The hot path: one call per client request, straight to the counters.
        self.request = self.stats.record
        self.snapshots = (
            Snapshots(self.stats, self._multiproc, clock=clock) if self._multiproc else None
        )
        self.registry.register(_LiveCollector(self))
        self.registry.register(StatsCollector(self.stats))

    def start(self) -> None:
        """With several workers: share this one's request counters with the others."""
        if self.snapshots is not None:
            self.snapshots.start()

    async def close(self) -> None:
        if self.snapshots is not None:
            await self.snapshots.close()

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
            models = self.model_label
            self._child(
                self.fallbacks, models(str(fields.get("from"))), models(str(fields.get("to")))
            ).inc()
        elif name == "cooldown":
            self._child(self.cooldowns, dep).inc()
        elif name == "probe":
            self._child(self.probes, dep, str(fields.get("outcome"))).inc()
        elif name == "client_gone":
            self._child(self.clients_gone, dep, reason).inc()

    def dropped(self, shape: str, names: Iterable[str]) -> None:
        """Parameters a request's translation left out (each a plain name, or `other`)."""
        for name in names:
            if len(self._event_children) < 10_000:  # a client's names are bounded here too
                self._child(self.dropped_params, shape, name).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._event_children.get(key)
        if child is None:
            child = self._event_children[key] = metric.labels(*labels)
        return child

    def deployments(self, targets: Iterable[Any]) -> None:
        """Create the per-deployment series at start (or reload), so a scrape shows every
        deployment (closed breakers, zero failovers) before anything happens; and learn the
        configured model names, the only ones a label may take."""
        exact: set[str] = set()
        patterns: list[str] = []
        for target in targets:
            dep = target if isinstance(target, str) else target.id
            self._child(self.breaker_state, dep).set(0.0)
            group = getattr(target, "group", None)
            if group is not None:
                names = (group.name, *group.fallbacks, *group.context_fallbacks)
                for model in names:
                    if any(c in model for c in "*?["):
                        patterns.append(model)
                    else:
                        exact.add(model)
        self._models = frozenset(exact)
        self._patterns = tuple(dict.fromkeys(patterns))

    def model_label(self, model: str) -> str:
        """A model name fit for a label: a configured name (or the wildcard group it falls
        in), else `other`. A client's model names never make a series of their own: 2,300
        names once made /metrics 60 MB."""
        if model in self._models:
            return model
        for pattern in self._patterns:
            if fnmatch.fnmatchcase(model, pattern):
                return pattern
        return OTHER

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
            assert self.snapshots is not None
            registry.register(StatsCollector(self.snapshots.merged()))
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
            cache = target.adapter.handles
            if cache is not None:
                handles.add_metric([dep], len(cache))
                stats = cache.stats
                for op in ("created", "refreshed", "healed", "failed"):
                    handle_events.add_metric([dep, op], getattr(stats, op))
        yield from (in_flight, drained, error_rate, handles, handle_events)

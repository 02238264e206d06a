"""The request families as Prometheus sees them, built from `RequestStats` when scraped:
requests, latency and time to first token (also under the OpenTelemetry GenAI names),
attempts, and what was spent (tokens, dollars, cache results, budgets)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ballast.observe.request_stats import (
    CACHED,
    COST,
    INPUT,
    LATENCY_BUCKETS,
    OUTPUT,
    REASONING,
    REQUESTS,
    TOKEN_BUCKETS,
    TTFT_BUCKETS,
    WRITTEN,
    WRITTEN_1H,
    RequestStats,
)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out = []
    total = 0
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        total += n
        out.append((floatToGoString(bound), float(total)))  # type: ignore[no-untyped-call]
    return out


class StatsCollector(Collector):
    """The request families as Prometheus sees them, built from `RequestStats` at scrape."""

    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        requests = CounterMetricFamily(
            "ballast_requests",
            "Client requests by model group, deployment, status and outcome.",
            labels=["model", "deployment", "status", "outcome"],
        )
        for key, n in sorted(stats.counts.items()):
            requests.add_metric(list(key), float(n))
        latency = HistogramMetricFamily(
            "ballast_request_duration_seconds",
            "Client request latency, first byte received to last byte sent.",
            labels=["model", "deployment"],
        )
        ttft = HistogramMetricFamily(
            "ballast_time_to_first_token_seconds",
            "Streams: time from the request to the first byte of the answer sent to the client.",
            labels=["model", "deployment"],
        )
        for pair, t in sorted(stats.timings.items()):
            latency.add_metric(list(pair), _buckets(LATENCY_BUCKETS, t.latency), t.latency_sum)
            ttft.add_metric(list(pair), _buckets(TTFT_BUCKETS, t.ttft), t.ttft_sum)
        attempts = CounterMetricFamily(
            "ballast_upstream_attempts",
            "Upstream attempts made for client requests (first tries, retries, continuations).",
            labels=["model"],
        )
        for model, n in sorted(stats.attempts.items()):
            attempts.add_metric([model], float(n))
        shapes = CounterMetricFamily(
            "ballast_requests_by_shape",
            "Client requests by the inbound API they spoke (openai, anthropic, responses) and"
            " outcome.",
            labels=["shape", "outcome"],
        )
        for pair, n in sorted(stats.shapes.items()):
            shapes.add_metric(list(pair), float(n))
        yield from (requests, latency, ttft, attempts, shapes)
        yield from _genai_timings(stats)
        yield from _usage_families(stats)


def _genai_timings(stats: RequestStats) -> Iterator[Metric]:
    """The same histograms under the OpenTelemetry GenAI names (gen_ai.client.operation.
    duration, gen_ai.server.time_to_first_token): built at scrape, nothing per request."""
    labels = ["gen_ai_request_model", "deployment"]
    duration = HistogramMetricFamily(
        "gen_ai_client_operation_duration_seconds",
        "GenAI operation duration (OpenTelemetry semantic conventions).",
        labels=labels,
    )
    ttft = HistogramMetricFamily(
        "gen_ai_server_time_to_first_token_seconds",
        "Streams: time to the first token sent (OpenTelemetry semantic conventions).",
        labels=labels,
    )
    for pair, t in sorted(stats.timings.items()):
        duration.add_metric(list(pair), _buckets(LATENCY_BUCKETS, t.latency), t.latency_sum)
        ttft.add_metric(list(pair), _buckets(TTFT_BUCKETS, t.ttft), t.ttft_sum)
    yield from (duration, ttft)


# The `type` label of ballast_tokens and the usage row's column it counts.
_TOKEN_TYPES = (
    ("input", INPUT),
    ("output", OUTPUT),
    ("cached", CACHED),
    ("cache_write", WRITTEN),
    ("cache_write_1h", WRITTEN_1H),
    ("reasoning", REASONING),
)


def _usage_families(stats: RequestStats) -> Iterator[Metric]:
    """Tokens, dollars, cache results and budgets: what on-call and finance both read."""
    usage_labels = ["model", "deployment", "provider", "shape", "key_id"]
    tokens = CounterMetricFamily(
        "ballast_tokens",
        "Tokens by type: input and output, and parts of them as the provider billed them"
        " (cached: input read from the prompt cache; cache_write: input written to it;"
        " cache_write_1h: of those, kept for an hour; reasoning: output spent reasoning).",
        labels=[*usage_labels, "type"],
    )
    cost = CounterMetricFamily(
        "ballast_cost_dollars", "Dollars spent, at the configured prices.", labels=usage_labels
    )
    answered = CounterMetricFamily(
        "ballast_answered_requests",
        "Answered requests with their usage accounted.",
        labels=usage_labels,
    )
    for key, row in sorted(stats.usage.items()):
        labels = list(key)
        for kind, column in _TOKEN_TYPES:
            tokens.add_metric([*labels, kind], float(row[column]))
        cost.add_metric(labels, float(row[COST]))
        answered.add_metric(labels, float(row[REQUESTS]))
    usage = HistogramMetricFamily(
        "gen_ai_client_token_usage",
        "Tokens per request (OpenTelemetry GenAI semantic conventions).",
        labels=[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "deployment",
            "shape",
            "gen_ai_token_type",
        ],
    )
    for series, counts in sorted(stats.tokens.items()):
        usage.add_metric(list(series), _buckets(TOKEN_BUCKETS, counts[:-1]), float(counts[-1]))
    cache = CounterMetricFamily(
        "ballast_cache_requests",
        "Response cache lookups by result (hit, miss, bypass).",
        labels=["model", "result"],
    )
    for pair, n in sorted(stats.cache.items()):
        cache.add_metric(list(pair), float(n))
    budget = GaugeMetricFamily(
        "ballast_key_budget_remaining_dollars",
        "Dollars left in the key's budget period, as of its last request.",
        labels=["key_id"],
    )
    for key_id, left in sorted(stats.budget.items()):
        budget.add_metric([key_id], left)
    yield from (tokens, cost, answered, usage, cache, budget)

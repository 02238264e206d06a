"""The numbers recorded for every client request (count by outcome, latency and time to first
token histograms, upstream attempts), kept as plain Python counters.

prometheus_client's metric objects take a lock and walk their buckets in Python on every
call; in the running gateway that cost several microseconds per request. Here a request
costs two dict lookups, a `bisect` and a few additions, and the Prometheus families are built
only when scraped.

Several workers (`ballast serve --workers N`) each write a snapshot of their own counters
into the shared metrics directory about once a second (`Snapshots`); the worker that
answers a scrape adds the others' snapshots to its live numbers. Counters are cumulative
per process, so a stopped worker's last snapshot keeps counting in the totals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

log = logging.getLogger("ballast.metrics")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SNAPSHOT_PREFIX = "ballast-requests-"


class _Timing:
    """One (model, deployment)'s histograms: counts per bucket (the last is +Inf) and sums."""

    __slots__ = ("latency", "latency_sum", "ttft", "ttft_sum")

    def __init__(self) -> None:
        self.latency = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0


class RequestStats:
    """This process's request counters since it started."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, str], int] = {}
        self.timings: dict[tuple[str, str], _Timing] = {}
        self.attempts: dict[str, int] = {}
        self.shapes: dict[tuple[str, str], int] = {}  # (inbound API shape, outcome)
        self.changed = False

    def record(
        self,
        model: str,
        deployment: str,
        status: int,
        outcome: str,
        latency: float,
        ttft: float | None,
        attempts: int,
        shape: str = "openai",
    ) -> None:
        key = (model, deployment, str(status), outcome)
        by_shape = (shape, outcome)
        self.shapes[by_shape] = self.shapes.get(by_shape, 0) + 1
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        timing = self.timings.get((model, deployment))
        if timing is None:
            timing = self.timings[(model, deployment)] = _Timing()
        timing.latency[bisect_left(LATENCY_BUCKETS, latency)] += 1
        timing.latency_sum += latency
        if ttft is not None:
            timing.ttft[bisect_left(TTFT_BUCKETS, ttft)] += 1
            timing.ttft_sum += ttft
        if attempts:
            self.attempts[model] = self.attempts.get(model, 0) + attempts
        self.changed = True

    def add(self, other: RequestStats) -> None:
        """Add another process's counters into these."""
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for pair, theirs in other.timings.items():
            mine = self.timings.get(pair)
            if mine is None:
                mine = self.timings[pair] = _Timing()
            mine.latency = [a + b for a, b in zip(mine.latency, theirs.latency, strict=True)]
            mine.latency_sum += theirs.latency_sum
            mine.ttft = [a + b for a, b in zip(mine.ttft, theirs.ttft, strict=True)]
            mine.ttft_sum += theirs.ttft_sum
        for model, n in other.attempts.items():
            self.attempts[model] = self.attempts.get(model, 0) + n
        for pair, n in other.shapes.items():
            self.shapes[pair] = self.shapes.get(pair, 0) + n

    def dumps(self) -> bytes:
        return orjson.dumps(
            {
                "counts": [[*key, n] for key, n in self.counts.items()],
                "timings": [
                    [*key, t.latency, t.latency_sum, t.ttft, t.ttft_sum]
                    for key, t in self.timings.items()
                ],
                "attempts": self.attempts,
                "shapes": [[*key, n] for key, n in self.shapes.items()],
            }
        )

    @classmethod
    def loads(cls, data: bytes) -> RequestStats:
        """Read a snapshot; ValueError when it is not one (half-written, another version)."""
        stats = cls()
        try:
            raw: Any = orjson.loads(data)
            for model, dep, status, outcome, n in raw["counts"]:
                stats.counts[(str(model), str(dep), str(status), str(outcome))] = int(n)
            for model, dep, latency, latency_sum, ttft, ttft_sum in raw["timings"]:
                timing = _Timing()
                if len(latency) != len(timing.latency) or len(ttft) != len(timing.ttft):
                    raise ValueError("buckets differ")
                timing.latency = [int(n) for n in latency]
                timing.latency_sum = float(latency_sum)
                timing.ttft = [int(n) for n in ttft]
                timing.ttft_sum = float(ttft_sum)
                stats.timings[(str(model), str(dep))] = timing
            stats.attempts = {str(k): int(v) for k, v in raw["attempts"].items()}
            for shape, outcome, n in raw.get("shapes", ()):  # absent in older snapshots
                stats.shapes[(str(shape), str(outcome))] = int(n)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a request stats snapshot: {exc}") from None
        return stats


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
            "Client requests by the inbound API they spoke (openai, anthropic) and outcome.",
            labels=["shape", "outcome"],
        )
        for pair, n in sorted(stats.shapes.items()):
            shapes.add_metric(list(pair), float(n))
        yield from (requests, latency, ttft, attempts, shapes)


class Snapshots:
    """This worker's counters in the shared metrics directory, and everyone's read back."""

    def __init__(
        self, stats: RequestStats, directory: str, interval: float = 1.0, name: str = ""
    ) -> None:
        self.stats = stats
        self.directory = Path(directory)
        self.interval = interval
        self.path = self.directory / f"{SNAPSHOT_PREFIX}{name or os.getpid()}.json"
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop writing, after one last snapshot (nothing counted is lost at shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.flush()
            except OSError as exc:
                log.warning("could not write request metrics for other workers: %s", exc)

    async def flush(self) -> None:
        if not self.stats.changed:
            return
        self.stats.changed = False
        data = self.stats.dumps()  # taken on the loop: the counters do not move under it
        await asyncio.to_thread(self._write, data)

    def _write(self, data: bytes) -> None:
        partial = self.path.with_suffix(".tmp")
        partial.write_bytes(data)
        partial.replace(self.path)  # atomic: a reader never sees half a snapshot

    def merged(self) -> RequestStats:
        """Every worker's counters: this one's live, the others' from their snapshots."""
        total = RequestStats()
        total.add(self.stats)
        for path in self.directory.glob(f"{SNAPSHOT_PREFIX}*.json"):
            if path == self.path:
                continue
            try:
                total.add(RequestStats.loads(path.read_bytes()))
            except (OSError, ValueError) as exc:
                log.warning("skipping the request metrics in %s: %s", path.name, exc)
        return total

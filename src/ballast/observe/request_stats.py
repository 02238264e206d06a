"""The numbers recorded for every client request (count by outcome, latency and time to first
token histograms, upstream attempts, tokens and dollars), kept as plain Python counters;
families.py turns them into Prometheus families when scraped.

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
from pathlib import Path
from typing import Any

import orjson

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.stream.usage import Usage

log = logging.getLogger("ballast.metrics")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# The OpenTelemetry GenAI semantic conventions' advice for gen_ai.client.token.usage.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
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


# (model, deployment, provider, shape, key id): what was asked and spent.
UsageKey = tuple[str, str, str, str, str]
# (operation, provider, model, deployment, shape, token type): a token histogram's series.
TokenKey = tuple[str, str, str, str, str, str]
# A usage row: requests, then the tokens of `Usage` (input, output, and their parts: read
# from the prompt cache, written to it, of those for an hour, reasoning), then dollars.
REQUESTS, INPUT, OUTPUT, CACHED, WRITTEN, WRITTEN_1H, REASONING, COST = range(8)
_ROW = (0, 0, 0, 0, 0, 0, 0, 0.0)


class RequestStats:
    """This process's request counters since it started."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, str], int] = {}
        self.timings: dict[tuple[str, str], _Timing] = {}
        self.attempts: dict[str, int] = {}
        self.shapes: dict[tuple[str, str], int] = {}  # (inbound API shape, outcome)
        # [requests, the tokens of each type, dollars]: see REQUESTS ... COST
        self.usage: dict[UsageKey, list[float]] = {}
        # bucket counts (the last is +Inf), then the sum
        self.tokens: dict[TokenKey, list[int]] = {}
        self.cache: dict[tuple[str, str], int] = {}  # (model, hit|miss|bypass)
        self.budget: dict[str, float] = {}  # key id -> dollars left in the period
        self._histograms: dict[tuple[str, UsageKey], tuple[list[int], list[int]]] = {}
        self.changed = False

    def record_usage(
        self,
        key: UsageKey,
        operation: str,
        usage: Usage,
        cost: float,
    ) -> None:
        """An answered request's tokens and dollars (after `record`, off the hot path's
        critical part: a few dict operations)."""
        row = self.usage.get(key)
        if row is None:
            row = self.usage[key] = list(_ROW)
        input_tokens, output_tokens, cached, written, written_1h, reasoning = usage
        row[REQUESTS] += 1
        row[INPUT] += input_tokens
        row[OUTPUT] += output_tokens
        row[CACHED] += cached
        row[WRITTEN] += written
        row[WRITTEN_1H] += written_1h
        row[REASONING] += reasoning
        row[COST] += cost
        histograms = self._histograms.get((operation, key))
        if histograms is None:
            histograms = self._histograms[(operation, key)] = self._token_series(operation, key)
        inputs, outputs = histograms
        inputs[bisect_left(TOKEN_BUCKETS, input_tokens)] += 1
        inputs[-1] += input_tokens
        outputs[bisect_left(TOKEN_BUCKETS, output_tokens)] += 1
        outputs[-1] += output_tokens
        self.changed = True

    def _token_series(self, operation: str, key: UsageKey) -> tuple[list[int], list[int]]:
        """The input and output token histograms one usage key adds to."""
        model, deployment, provider, shape, _ = key
        found = []
        for kind in ("input", "output"):
            series = (operation, provider, model, deployment, shape, kind)
            counts = self.tokens.get(series)
            if counts is None:
                counts = self.tokens[series] = [0] * (len(TOKEN_BUCKETS) + 2)
            found.append(counts)
        return found[0], found[1]

    def record_cache(self, model: str, status: str) -> None:
        key = (model, status)
        self.cache[key] = self.cache.get(key, 0) + 1
        self.changed = True

    def record_budget(self, key_id: str, remaining: float) -> None:
        self.budget[key_id] = remaining
        self.changed = True

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
        self._add_usage(other)

    def _add_usage(self, other: RequestStats) -> None:
        for usage_key, theirs in other.usage.items():
            row = self.usage.get(usage_key)
            if row is None:
                row = self.usage[usage_key] = list(_ROW)
            for i, amount in enumerate(theirs):
                row[i] += amount
        for series, their_counts in other.tokens.items():
            counts = self.tokens.get(series)
            if counts is None:
                counts = self.tokens[series] = [0] * (len(TOKEN_BUCKETS) + 2)
            for i, count in enumerate(their_counts):
                counts[i] += count
        for cache_key, count in other.cache.items():
            self.cache[cache_key] = self.cache.get(cache_key, 0) + count
        for key_id, left in other.budget.items():
            # Each worker saw the shared spend at its last request: the least left is the
            # latest figure (spend only grows within a period).
            known = self.budget.get(key_id)
            self.budget[key_id] = left if known is None else min(known, left)

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
                "usage": [[*key, *row] for key, row in self.usage.items()],
                "tokens": [[*key, *counts] for key, counts in self.tokens.items()],
                "cache": [[*key, n] for key, n in self.cache.items()],
                "budget": self.budget,
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
            for row in raw["usage"]:
                stats.usage[_usage_key(row[:5])] = _usage_row(row[5:])
            for row in raw["tokens"]:
                operation, provider, model, dep, shape, kind = (str(n) for n in row[:6])
                counts = [int(n) for n in row[6:]]
                if len(counts) != len(TOKEN_BUCKETS) + 2:
                    raise ValueError("token buckets differ")
                stats.tokens[(operation, provider, model, dep, shape, kind)] = counts
            for model, status, n in raw["cache"]:
                stats.cache[(str(model), str(status))] = int(n)
            stats.budget = {str(k): float(v) for k, v in raw["budget"].items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a request stats snapshot: {exc}") from None
        return stats


def _usage_key(names: list[Any]) -> UsageKey:
    model, dep, provider, shape, key_id = (str(n) for n in names)
    return model, dep, provider, shape, key_id


def _usage_row(values: list[Any]) -> list[float]:
    """A snapshot's usage row; one of a Ballast before the cache's writes and reasoning were
    counted has five values (requests, input, output, cached, dollars)."""
    if len(values) == 5:
        values = [*values[:4], 0, 0, 0, values[4]]
    if len(values) != len(_ROW):
        raise ValueError("usage columns differ")
    return [*(int(n) for n in values[:COST]), float(values[COST])]


class Snapshots:
    """This worker's counters in the shared metrics directory, and everyone's read back."""

    def __init__(
        self,
        stats: RequestStats,
        directory: str,
        interval: float = 1.0,
        name: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.stats = stats
        self.clock = clock
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
            await self.clock.sleep(self.interval)
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

"""The per-request counters: histogram buckets, snapshots and the sum over workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ballast.observe.families import StatsCollector
from ballast.observe.request_stats import RequestStats, Snapshots
from ballast.stream.usage import Usage


def samples(stats: RequestStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats))
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_buckets_are_cumulative_and_inclusive_of_their_bound() -> None:
    stats = RequestStats()
    stats.record("chat", "a", 200, "ok", 0.01, None, 1)  # exactly on the first bound
    stats.record("chat", "a", 200, "ok", 0.02, 0.004, 1)
    stats.record("chat", "a", 502, "failed", 500.0, None, 3)  # past the last bound
    got = samples(stats)
    labels = (("deployment", "a"), ("model", "chat"))

    def bucket(name: str, le: str) -> float:
        return got[(name, tuple(sorted((*labels, ("le", le)))))]

    assert bucket("ballast_request_duration_seconds_bucket", "0.01") == 1
    assert bucket("ballast_request_duration_seconds_bucket", "0.025") == 2
    assert bucket("ballast_request_duration_seconds_bucket", "120.0") == 2
    assert bucket("ballast_request_duration_seconds_bucket", "+Inf") == 3
    assert got[("ballast_request_duration_seconds_count", labels)] == 3
    assert got[("ballast_request_duration_seconds_sum", labels)] == pytest.approx(500.03)
    assert bucket("ballast_time_to_first_token_seconds_bucket", "0.005") == 1
    assert got[("ballast_time_to_first_token_seconds_count", labels)] == 1
    ok = (("deployment", "a"), ("model", "chat"), ("outcome", "ok"), ("status", "200"))
    assert got[("ballast_requests_total", ok)] == 2
    assert got[("ballast_upstream_attempts_total", (("model", "chat"),))] == 5


def test_a_snapshot_reads_back_as_the_same_counters() -> None:
    stats = RequestStats()
    stats.record("chat", "a", 200, "ok", 0.3, 0.05, 1)
    stats.record("embed", "e", 429, "rejected", 0.001, None, 0)
    again = RequestStats.loads(stats.dumps())
    assert samples(again) == samples(stats)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"[]",
        b'{"counts": [[1]]}',
        b'{"counts": [], "timings": [["m", "d", [1], 0, [], 0]]}',
    ],
)
def test_a_broken_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        RequestStats.loads(data)


def test_each_worker_sees_the_sum_of_every_worker(tmp_path: Path) -> None:
    async def scenario() -> None:
        one, two = RequestStats(), RequestStats()
        first = Snapshots(one, str(tmp_path), name="1")
        second = Snapshots(two, str(tmp_path), name="2")
        one.record("chat", "a", 200, "ok", 0.1, None, 1)
        two.record("chat", "a", 200, "ok", 0.2, None, 1)
        two.record("chat", "b", 200, "recovered", 0.2, None, 2)
        await second.flush()
        merged = samples(first.merged())
        ok = (("deployment", "a"), ("model", "chat"), ("outcome", "ok"), ("status", "200"))
        assert merged[("ballast_requests_total", ok)] == 2
        assert merged[("ballast_upstream_attempts_total", (("model", "chat"),))] == 4
        # A torn file from a crashed writer is skipped, not fatal.
        (tmp_path / "ballast-requests-3.json").write_bytes(b'{"counts": [')
        assert samples(first.merged())[("ballast_requests_total", ok)] == 2
        # The last snapshot is written on close, so a stopping worker's counts stay.
        two.record("chat", "a", 200, "ok", 0.1, None, 1)
        await second.close()
        assert samples(first.merged())[("ballast_requests_total", ok)] == 3

    asyncio.run(scenario())


def test_usage_cache_and_budget_travel_between_workers() -> None:
    """Each worker's tokens and dollars reach the scrape summed; a budget is the least left."""
    one, two = RequestStats(), RequestStats()
    key = ("chat", "a", "openai", "openai", "k1")
    one.record_usage(key, "chat", Usage(10, 3, 2, 4, 1, 2), 0.1)
    two.record_usage(key, "chat", Usage(20, 7, 0, 0, 0, 5), 0.2)
    one.record_cache("chat", "hit")
    two.record_cache("chat", "hit")
    one.record_budget("k1", 5.0)
    two.record_budget("k1", 4.5)
    total = RequestStats()
    total.add(RequestStats.loads(one.dumps()))
    total.add(RequestStats.loads(two.dumps()))
    assert total.usage[key] == [2, 30, 10, 2, 4, 1, 7, 0.1 + 0.2]
    assert total.cache == {("chat", "hit"): 2}
    assert total.budget == {"k1": 4.5}
    tokens = total.tokens[("chat", "openai", "chat", "a", "openai", "input")]
    assert tokens[-1] == 30 and sum(tokens[:-1]) == 2  # the sum, and two requests counted
    # A snapshot of a worker from before the cache's writes and reasoning were counted.
    older = orjson.loads(one.dumps())
    older["usage"] = [[*key, 1, 10, 3, 2, 0.1]]
    assert RequestStats.loads(orjson.dumps(older)).usage[key] == [1, 10, 3, 2, 0, 0, 0, 0.1]

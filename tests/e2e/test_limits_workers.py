"""Limits per key, not per process: without Redis, the workers of one machine share every
key's RPM and parallel limits (a memory-mapped file), so the number set is the number that
gets through, within one request, at 2 and 4 workers."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from ballast.server.serving import balances_reuse_port
from tests.e2e.test_access import MASTER
from tests.e2e.test_budget_concurrency import admin_at
from tests.e2e.test_workers import workers
from tests.stack import Stack, deployment, free_port, group, serve, sqlite_state, wait_for

pytestmark = pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT")

BODY = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(params=[2, 4])
def gateway(stack: Stack, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    sim = stack.sim("ok?tokens=2&latency=1.0")
    config = {
        "server": {"master_key": MASTER},
        "state": sqlite_state(tmp_path),
        "models": [group("chat", deployment("a", sim))],
    }
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    process = serve(path, port, workers=request.param, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(workers(process.pid)) == request.param, timeout=60)
        wait_for(lambda: admin_at(url, "/health")[0] == 200, timeout=60)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr.decode()[-2000:]


def _key(url: str, **limits: int) -> str:
    request = urllib.request.Request(
        url + "/admin/keys",
        data=json.dumps({"name": "limited", **limits}).encode(),
        method="POST",
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["key"])


def _ask(url: str, key: str) -> int:
    """One request on a connection of its own (so the kernel spreads them over workers)."""
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=BODY,
        method="POST",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status  # type: ignore[no-any-return]
    except urllib.error.HTTPError as error:
        assert error.code == 429, error.read()
        return error.code


def _burst(url: str, key: str, count: int) -> list[int]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: _ask(url, key), range(count)))


def test_rpm_10_lets_10_through_whatever_the_workers(gateway: str) -> None:
    key = _key(gateway, rpm=10)
    statuses = _burst(gateway, key, 30)
    assert 10 <= statuses.count(200) <= 11, statuses


def test_parallel_5_runs_5_at_once_whatever_the_workers(gateway: str) -> None:
    key = _key(gateway, max_parallel=5)
    statuses = _burst(gateway, key, 20)  # each answer takes a second: all overlap
    assert 5 <= statuses.count(200) <= 6, statuses
    assert _burst(gateway, key, 5).count(200) == 5  # the slots came back

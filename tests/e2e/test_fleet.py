"""Admin actions reach every worker and every instance: drain, reload and key revocation
with `ballast serve --workers 2` (real processes, connections spread over both workers by
the kernel), and between two gateways sharing only a database (the fallback when Redis is
down or not configured). `/admin/state` answers for the whole fleet."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.server.serving import balances_reuse_port
from tests.e2e.test_workers import connections_per_worker, workers
from tests.stack import Gateway, Stack, deployment, free_port, group, serve, sqlite_state, wait_for

MASTER = "sk-master-fleet-0123456789"
BODY = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
PROMPTLY = 1.0  # seconds: every action must have reached everyone by then


def _request(
    port: int, method: str, path: str, body: Any = None, key: str = MASTER
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        data = json.dumps(body) if body is not None else None
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        connection.request(method, path, data, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


@contextlib.contextmanager
def together(port: int, count: int) -> Iterator[list[http.client.HTTPConnection]]:
    """`count` connections opened at once (the kernel spreads them over the workers)."""
    clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=20) for _ in range(count)]
    try:
        for client in clients:
            client.connect()
        yield clients
    finally:
        for client in clients:
            client.close()


def _ask(client: http.client.HTTPConnection, key: str = MASTER, path: str = "") -> int:
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    if path:
        client.request("GET", path, headers=headers)
    else:
        client.request("POST", "/v1/chat/completions", BODY, headers)
    response = client.getresponse()
    response.read()
    return response.status


def _config(path: Path, stack_sims: tuple[Any, Any], tmp_path: Path, **extra: Any) -> None:
    sim_a, sim_b = stack_sims
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"master_key": MASTER},
                "state": sqlite_state(tmp_path),
                "models": [
                    group("chat", deployment("a", sim_a), deployment("b", sim_b)),
                    *extra.get("more", []),
                ],
            }
        )
    )


@pytest.fixture
def two_workers(
    stack: Stack, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path, tuple[Any, Any]]]:
    if not balances_reuse_port():
        pytest.skip("needs Linux SO_REUSEPORT")
    sims = (stack.sim("ok?tokens=2", name="a"), stack.sim("ok?tokens=2", name="b"))
    path = tmp_path / "ballast.yaml"
    _config(path, sims, tmp_path)
    port = free_port()
    process = serve(path, port, workers=2, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(workers(process.pid)) == 2, timeout=30)
        wait_for(lambda: _fleet_size(port) == 2, timeout=30)
        yield process, port, path, sims
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr.decode()[-2000:]
        assert b"Traceback" not in stderr, stderr.decode()[-2000:]


def _fleet_size(port: int) -> int:
    try:
        status, body = _request(port, "GET", "/admin/state")
    except OSError:
        return 0
    return int(body["fleet"]["sum"]["workers"]) if status == 200 else 0


def test_drain_reaches_both_workers_at_once(
    stack: Stack, two_workers: tuple[subprocess.Popen[bytes], int, Path, tuple[Any, Any]]
) -> None:
    process, port, _, (sim_a, _) = two_workers
    status, body = _request(port, "POST", "/admin/deployments/a/drain")
    drained_at = time.monotonic()
    assert status == 200 and body["fleet"]["workers_reached"] == 2
    stack.clear_log(sim_a)
    with together(port, 24) as clients:
        assert all(_ask(c) == 200 for c in clients)
        elapsed = time.monotonic() - drained_at
        counts = connections_per_worker(process.pid, port)
    assert len(counts) == 2 and min(counts.values()) > 0, counts  # both workers answered
    assert stack.attempts(sim_a) == [] and elapsed < PROMPTLY + 5  # none went to a
    status, state = _request(port, "GET", "/admin/state")
    assert [w["drained"] for w in state["fleet"]["workers"]] == [["a"], ["a"]]
    assert state["fleet"]["sum"]["workers"] == 2 and state["fleet"]["sum"]["instances"] == 1
    (instance,) = state["fleet"]["instances"].values()
    assert instance["workers"] == 2 and instance["in_flight"] >= 0
    _request(port, "POST", "/admin/deployments/a/enable")
    status, state = _request(port, "GET", "/admin/state")
    assert [w["drained"] for w in state["fleet"]["workers"]] == [[], []]


def test_reload_reaches_both_workers(
    stack: Stack,
    tmp_path: Path,
    two_workers: tuple[subprocess.Popen[bytes], int, Path, tuple[Any, Any]],
) -> None:
    _, port, path, sims = two_workers
    _config(path, sims, tmp_path, more=[group("extra", deployment("x", sims[0]))])
    status, body = _request(port, "POST", "/admin/reload")
    assert status == 200 and body["fleet"]["workers_reached"] == 2
    reloaded_at = time.monotonic()
    deadline = reloaded_at + 10
    while True:
        status, state = _request(port, "GET", "/admin/state")
        if all("extra" in w["models"] for w in state["fleet"]["workers"]):
            break
        assert time.monotonic() < deadline, state["fleet"]
        time.sleep(0.02)
    assert time.monotonic() - reloaded_at < PROMPTLY
    with together(port, 16) as clients:
        assert all(_ask(c, path="/v1/models") == 200 for c in clients)


def test_a_key_revoked_with_the_cli_stops_working_on_both_workers(
    two_workers: tuple[subprocess.Popen[bytes], int, Path, tuple[Any, Any]],
) -> None:
    _, port, path, _ = two_workers
    status, created = _request(port, "POST", "/admin/keys", {"name": "soon revoked"})
    assert status == 201
    key = created["key"]
    with together(port, 16) as clients:  # each worker now remembers the key
        assert all(_ask(c, key) == 200 for c in clients)
    command = [sys.executable, "-m", "ballast", "keys", "revoke", "--config", str(path)]
    subprocess.run([*command, created["id"]], check=True, capture_output=True, timeout=60)
    revoked_at = time.monotonic()
    deadline = revoked_at + 10
    while True:
        with together(port, 16) as clients:
            statuses = [_ask(c, key) for c in clients]
        if set(statuses) == {401}:
            break
        assert time.monotonic() < deadline, statuses
        time.sleep(0.02)
    # Without Redis the command log carries it: polled every fleet.fallback_poll (0.5 s).
    assert time.monotonic() - revoked_at < PROMPTLY + 0.5


def test_a_revoked_key_stops_on_both_workers_with_its_old_value_in_its_grace_period(
    two_workers: tuple[subprocess.Popen[bytes], int, Path, tuple[Any, Any]],
) -> None:
    _, port, _, _ = two_workers
    status, created = _request(port, "POST", "/admin/keys", {"name": "rotated, then revoked"})
    assert status == 201
    old = created["key"]
    rotate = {"id": created["id"], "grace_seconds": 3600}
    status, rotated = _request(port, "POST", "/admin/keys/rotate", rotate)
    assert status == 200
    with together(port, 16) as clients:  # each worker now remembers both values
        assert all(_ask(c, key) == 200 for c in clients for key in (old, rotated["key"]))
    status, body = _request(port, "POST", "/admin/keys/revoke", {"id": created["id"]})
    assert status == 200 and body["revoked"]
    revoked_at = time.monotonic()
    while True:
        with together(port, 16) as clients:
            statuses = [_ask(c, key) for c in clients for key in (old, rotated["key"])]
        if set(statuses) == {401}:
            break
        assert time.monotonic() - revoked_at < 10, statuses
        time.sleep(0.02)
    assert time.monotonic() - revoked_at < PROMPTLY


def _gateways(
    stack: Stack, tmp_path: Path, redis_url: str | None, instances: int = 2
) -> tuple[Gateway, Gateway]:
    sim = stack.sim("ok?tokens=2")
    state: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / 'shared.db'}",
        "spend_journal": str(tmp_path / "spend.journal"),
        "instances": instances,
    }
    if redis_url is not None:
        state["redis_url"] = redis_url
    config = {
        "server": {"master_key": MASTER},
        "state": state,
        "models": [group("chat", deployment("a", sim), deployment("b", sim))],
    }
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    one, two = stack.gateway(config), stack.gateway(config)
    one.app.config_path = two.app.config_path = str(path)
    return one, two


def _within(predicate: Any, seconds: float) -> float:
    started = time.monotonic()
    wait_for(predicate, timeout=seconds + 10)
    return time.monotonic() - started


@pytest.mark.parametrize("redis", ["not configured", "down"])
def test_two_instances_without_redis_share_actions_through_the_database(
    stack: Stack, tmp_path: Path, redis: str
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0" if redis == "down" else None
    one, two = _gateways(stack, tmp_path, dead)
    status, body = _request(one.port, "POST", "/admin/deployments/a/drain")
    assert status == 200 and body["fleet"]["database"] is True
    assert _within(lambda: two.router.targets["a"].drained, PROMPTLY) < PROMPTLY
    status, created = _request(one.port, "POST", "/admin/keys", {"name": "k"})
    key = created["key"]
    assert _request(two.port, "POST", "/v1/chat/completions", json.loads(BODY), key)[0] == 200
    assert _request(one.port, "POST", "/admin/keys/revoke", {"id": created["id"]})[0] == 200
    denied = _within(
        lambda: _request(two.port, "POST", "/v1/chat/completions", json.loads(BODY), key)[0] == 401,
        PROMPTLY,
    )
    assert denied < PROMPTLY
    assert _request(one.port, "POST", "/admin/reload")[0] == 200
    assert _within(lambda: two.app.generation.number == 2, PROMPTLY) < PROMPTLY

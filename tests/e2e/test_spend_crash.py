"""Spend survives `kill -9`: a gateway killed under load and started again has billed every
request a client got an answer for, and none twice (compared with the simulator's own count
of the calls it answered). Embedded SQLite here; PostgreSQL in
tests/integration/test_spend_crash_pg.py."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ballast.sim.server import SimServer
from tests.e2e.test_access import MASTER
from tests.e2e.test_workers import _children
from tests.stack import Stack, _http, deployment, free_port, group, serve, wait_for

BODY = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})


def _health(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


def _create_key(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "POST",
        "/admin/keys",
        json.dumps({"name": "crash", "budget": 1e9}),
        {"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 201
    return str(json.loads(response.read())["key"])


def _client(port: int, key: str, stop: threading.Event, answered: list[int]) -> None:
    """Asks until stopped or the gateway is gone; counts whole answers."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        try:
            connection.request("POST", "/v1/chat/completions", BODY, headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            return
        if response.status == 200 and json.loads(data).get("usage"):
            answered.append(1)


def kill_under_load(
    stack: Stack, sim: SimServer, tmp_path: Path, state: dict[str, Any], clients: int = 16
) -> tuple[int, int]:
    """(answers the clients got, calls the simulator answered) of a gateway killed with -9
    while `clients` keep it busy, then started again (which replays what it left)."""
    path = tmp_path / "ballast.yaml"
    config = {
        "server": {"master_key": MASTER},
        "state": state,
        "prices": {"sim-chat": {"input": 1.0, "output": 1.0}},
        "models": [group("chat", deployment("a", sim, model="sim-chat"))],
    }
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    process = serve(path, port, workers=1)
    try:
        wait_for(lambda: _health(port), timeout=30)
        key = _create_key(port)
        stack.clear_log(sim)
        stop = threading.Event()
        answered: list[int] = []
        threads = [
            threading.Thread(target=_client, args=(port, key, stop, answered))
            for _ in range(clients)
        ]
        for thread in threads:
            thread.start()
        time.sleep(2.5)
        for pid in [*_children(process.pid), process.pid]:
            os.kill(pid, signal.SIGKILL)
        process.wait(10)
        stop.set()
        for thread in threads:
            thread.join(15)
    finally:
        if process.poll() is None:
            process.kill()
    sim_answered = _http("GET", sim.url + "/sim/stats")["by_outcome"].get("ok", 0)
    restarted = serve(path, port, workers=1, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _health(port), timeout=30)  # ready once the replay is done
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.communicate(timeout=30)
    return len(answered), sim_answered


def check(answered: int, sim_answered: int, billed: Callable[[], tuple[int, int]]) -> None:
    events, distinct = billed()
    assert answered > 100  # the load was real
    assert events == distinct  # nothing billed twice
    assert answered <= events <= sim_answered, (answered, events, sim_answered)


def test_kill_9_under_load_leaves_no_answer_unbilled_on_sqlite(
    stack: Stack, tmp_path: Path
) -> None:
    sim = stack.sim("ok?tokens=2")
    database = tmp_path / "ballast.db"
    state = {
        "database_url": f"sqlite:///{database}",
        "spend_journal": str(tmp_path / "spend.journal"),
    }
    answered, sim_answered = kill_under_load(stack, sim, tmp_path, state)

    def billed() -> tuple[int, int]:
        with sqlite3.connect(database) as connection:
            row = connection.execute("SELECT count(*), count(DISTINCT id) FROM spend_events")
            events, distinct = row.fetchone()
        return int(events), int(distinct)

    check(answered, sim_answered, billed)

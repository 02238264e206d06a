"""`ballast serve` as a real process: SIGTERM under load loses no spend and exits 0;
after `kill -9` the loss is bounded by the flush interval."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.stack import Stack, free_port, sqlite_state

MASTER = "sk-master-for-shutdown-tests"
FLUSH = 0.5


def call(url: str, body: Any, key: str, timeout: float = 10) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read())


def start_gateway(
    stack: Stack, tmp_path: Path, extra_args: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    sim = stack.sim("ok?tokens=8&delay=0.005")
    port = free_port()
    config = {
        "server": {"master_key": MASTER},
        "state": sqlite_state(tmp_path, spend_flush_interval=FLUSH),
        "prices": {"sim-chat": {"input": 1_000_000, "output": 1_000_000}},  # $1 a token
        "models": [
            {
                "name": "chat",
                "deployments": [{"id": "a", "url": sim.url + "/v1", "model": "sim-chat"}],
            }
        ],
    }
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "gateway.log").open("wb")  # the child keeps its own descriptor
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ballast",
            "serve",
            "--config",
            str(path),
            "--port",
            str(port),
            *(extra_args or []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ},
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60  # generous: the suite shares two cores
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    tail = (tmp_path / "gateway.log").read_text(errors="replace")[-2000:]
    raise AssertionError(f"the gateway did not start:\n{tail}")


def run_load(url: str, key: str, stop: threading.Event) -> list[tuple[float, int]]:
    """(completion time, cost) of every successful response, from 8 threads."""
    done: list[tuple[float, int]] = []
    lock = threading.Lock()
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}

    def worker() -> None:
        while not stop.is_set():
            try:
                status, reply = call(url + "/v1/chat/completions", body, key)
            except (OSError, urllib.error.URLError, http.client.HTTPException):
                return  # the gateway went away, possibly mid-answer (the kill variant)
            if status == 200:
                usage = reply["usage"]
                with lock:
                    done.append(
                        (time.monotonic(), usage["prompt_tokens"] + usage["completion_tokens"])
                    )

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(15)
    return done


def stored(tmp_path: Path, key_id: str) -> float:
    with sqlite3.connect(tmp_path / "ballast.db") as db:
        row = db.execute(
            "SELECT COALESCE(SUM(cost), 0) FROM spend_events WHERE key_id = ?", (key_id,)
        ).fetchone()
    return float(row[0])


@pytest.mark.parametrize("how", ["sigterm", "kill"])
def test_shutdown_under_load(stack: Stack, tmp_path: Path, how: str) -> None:
    process, url = start_gateway(stack, tmp_path)
    try:
        status, created = call(url + "/admin/keys", {"name": "load"}, MASTER)
        assert status == 201
        stop = threading.Event()
        results: list[list[tuple[float, int]]] = []
        loader = threading.Thread(
            target=lambda: results.append(run_load(url, created["key"], stop))
        )
        loader.start()
        time.sleep(1.5)
        killed_at = time.monotonic()
        process.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = process.wait(20)
        stop.set()
        loader.join(20)
    finally:
        if process.poll() is None:
            process.kill()
    done = results[0]
    assert len(done) > 50
    total = sum(cost for _, cost in done)
    if how == "sigterm":
        assert code == 0
        assert stored(tmp_path, created["id"]) == total  # nothing lost
    else:
        # Only what finished within the last flush intervals before the kill may be missing.
        safe = sum(cost for at, cost in done if at < killed_at - 2 * FLUSH - 0.25)
        assert safe <= stored(tmp_path, created["id"]) <= total

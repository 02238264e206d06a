"""`ballast serve` says what it serves, with one worker as with several: the address, the
number of workers, the models and the state backends, with no secret in the line; and at
--log-level debug no token given in a query string reaches its output."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.hidden import run_without
from tests.stack import Stack, deployment, free_port, group


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_prints_a_startup_line(stack: Stack, tmp_path: Path, workers: int) -> None:
    sim = stack.sim()
    path = tmp_path / "ballast.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"master_key": "sk-master-startup-secret"},
                "state": {
                    "database_url": f"sqlite:///{tmp_path / 'ballast.db'}",
                    "redis_url": "redis://default:redis-startup-secret@127.0.0.1:1/0",
                },
                "models": [
                    group("chat", deployment("a", sim)),
                    group("embed", deployment("b", sim)),
                ],
            }
        )
    )
    port = free_port()
    command = [sys.executable, "-m", "ballast", "serve", "--config", str(path)]
    command += ["--port", str(port), "--workers", str(workers), "--log-format", "text"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, cwd=tmp_path)
    assert process.stderr is not None
    line = b""
    deadline = time.monotonic() + 30
    try:
        while b"Ballast serving on" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
            assert line or process.poll() is None
        _wait_ready(f"http://127.0.0.1:{port}")  # a SIGTERM before that is not yet handled
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    text = line.decode()
    plural = "worker" if workers == 1 else "workers"
    assert f"http://127.0.0.1:{port} with {workers} {plural}" in text
    assert "models: chat, embed" in text and "database: sqlite" in text
    assert "redis: redis://default:****@127.0.0.1:1/0" in text
    assert "secret" not in text


def test_debug_lines_carry_no_token_of_any_kind(stack: Stack, tmp_path: Path) -> None:
    """At --log-level debug uvicorn's lines carry whole paths: `?token=` must be masked, and
    no other library's debug lines get through."""
    import urllib.error
    import urllib.request

    dashboard, master = "dash-token-debug-secret", "sk-master-debug-secret"
    path = tmp_path / "ballast.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"master_key": master, "dashboard_token": dashboard},
                "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
                "models": [group("chat", deployment("a", stack.sim()))],
            }
        )
    )
    port = free_port()
    command = [sys.executable, "-m", "ballast", "serve", "--config", str(path)]
    command += ["--port", str(port), "--log-level", "debug", "--log-format", "text"]
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, stderr=stderr, cwd=tmp_path)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url)
            for token in (dashboard, master):
                urllib.request.urlopen(f"{url}/dashboard?token={token}", timeout=5).read()
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(f"{url}/admin/state?token=sk-wrong-debug-secret", timeout=5)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    text = log.read_text()
    assert "debug-secret" not in text
    # Debug is Ballast's own: other libraries stay at info (aiosqlite's debug lines carry
    # SQL parameters, every key's hash among them).
    assert " aiosqlite " not in text and " DEBUG sqlalchemy" not in text


def _wait_ready(url: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} never became ready")


def test_serve_without_a_needed_extra_stops_before_serving(tmp_path: Path) -> None:
    """A Bedrock deployment on a machine without botocore: one line naming the extra and
    its pip command, exit 2, and no "serving" line before it (the port is never bound)."""
    path = tmp_path / "ballast.yaml"
    bedrock = {
        "id": "br",
        "provider": "bedrock",
        "model": "anthropic.claude-3-haiku",
        "aws": {"region": "us-east-1"},
    }
    path.write_text(yaml.safe_dump({"models": [{"name": "claude", "deployments": [bedrock]}]}))
    port = free_port()
    result = run_without(("botocore",), "serve", "--config", str(path), "--port", str(port))
    assert result.returncode == 2
    assert "serving" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("install it with: pip install 'ballast[bedrock]'")

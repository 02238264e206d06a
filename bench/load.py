"""Non-streaming load with wrk, and the parsing of its results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "chat.lua"
# The request each inbound API shape sends (a target's `shape`).
# What a request of each inbound API shape (a target's `shape`) changes in chat.lua's: its
# body, the header that carries the key (else a bearer token) and headers of its own.
SHAPES: dict[str, dict[str, str]] = {
    "openai": {},
    "messages": {
        "BENCH_BODY": '{"model": "bench-model", "max_tokens": 256,'
        ' "messages": [{"role": "user", "content": "hi"}]}',
        "BENCH_KEY_HEADER": "x-api-key",
        "headers": "anthropic-version: 2023-06-01",
    },
    "responses": {"BENCH_BODY": '{"model": "bench-model", "input": "hi"}'},
}
MARKER = "BENCH_JSON "


@dataclass
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def wrk_path() -> str:
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk is not installed: apt-get install -y wrk (as root, Debian)")
    return found


def parse(stdout: str) -> WrkResult:
    """Read the JSON summary line that ``chat.lua`` prints from wrk's ``done`` hook."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            errors = sum(data[k] for k in data if k.startswith("err_"))
            return WrkResult(
                requests=int(data["requests"]),
                seconds=data["duration_us"] / 1e6,
                p50_ms=data["p50_us"] / 1e3,
                p90_ms=data["p90_us"] / 1e3,
                p99_ms=data["p99_us"] / 1e3,
                errors=int(errors),
            )
    raise ValueError("no summary line in wrk output:\n" + stdout[-2000:])


def run_wrk(
    url: str,
    connections: int,
    seconds: float,
    key: str = "sk-bench",
    shape: str = "openai",
    headers: dict[str, str] | None = None,
) -> WrkResult:
    """One bounded wrk run at ``connections`` keep-alive connections, sending ``key`` in a
    request of API ``shape`` (and ``headers`` on every request)."""
    # One thread: it drives over 200,000 requests/s against nginx here, far beyond any
    # gateway, and on two cores a second one only took CPU from what it measures (about
    # 3 us more a request, and 4 % fewer requests/s for two workers).
    cmd = [
        wrk_path(),
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(SCRIPT),
        url,
    ]
    wire = dict(SHAPES[shape])
    own = [wire.pop("headers")] if "headers" in wire else []
    own += [f"{name}: {value}" for name, value in (headers or {}).items()]
    env = {**os.environ, **wire, "BENCH_KEY": key, "BENCH_HEADERS": "|".join(own)}
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 30, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return parse(done.stdout)

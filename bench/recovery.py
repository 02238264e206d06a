"""How soon a recovered deployment is used again, with the default breaker and probe
settings: one deployment answers 503 for `--outage` seconds while requests arrive every
`--every` seconds, then recovers; the figure is the time from its recovery to the first
request it answers. Two shapes: two deployments of one model (health routing), and a
primary model that falls back to another. Every request must be answered.

    .venv/bin/python bench/recovery.py [--runs 5] [--outage 20] [--every 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import yaml

from procs import ProcessGroup, free_port, wait_ready


def _sim(procs: ProcessGroup, workdir: Path, name: str) -> str:
    port = free_port()
    cmd = [sys.executable, "-m", "ballast", "sim", "--port", str(port), "--name", name]
    cmd += ["--default", "ok?tokens=4"]
    proc = procs.start(cmd, workdir / f"sim-{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, 30, workdir / f"sim-{name}.log")
    return url


def _behave(sim: str, spec: str) -> None:
    body = json.dumps({"model": "*", "behaviour": spec}).encode()
    request = urllib.request.Request(
        sim + "/sim/behaviour", body, {"content-type": "application/json"}, method="PUT"
    )
    urllib.request.urlopen(request, timeout=5).read()


def _gateway(procs: ProcessGroup, workdir: Path, shape: str, a: str, b: str) -> str:
    port = free_port()

    def dep(dep_id: str, url: str) -> dict[str, Any]:
        return {"id": dep_id, "url": url + "/v1", "model": "m", "api_key": "sk-x"}

    if shape == "group":
        models = [{"name": "chat", "deployments": [dep("a", a), dep("b", b)]}]
    else:
        models = [
            {"name": "chat", "deployments": [dep("a", a)], "fallbacks": ["backup"]},
            {"name": "backup", "deployments": [dep("b", b)]},
        ]
    config = {
        "server": {"port": port},
        "models": models,
        "state": {
            "database_url": f"sqlite+aiosqlite:///{workdir}/{shape}.db",
            "spend_journal": str(workdir / f"{shape}.journal"),
        },
    }
    path = workdir / f"{shape}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "ballast", "serve", "--config", str(path), "--port", str(port)]
    log = workdir / f"gateway-{shape}.log"
    proc = procs.start([*cmd, "--log-level", "warning"], log)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, 60, log)
    return url


def _run(api: openai.OpenAI, a: str, a_name: str, outage: float, every: float) -> tuple[float, int]:
    """(seconds from recovery to a's first answer, client-visible errors)."""
    errors = 0

    def one() -> str:
        nonlocal errors
        try:
            reply = api.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}]
            )
        except openai.APIError:
            errors += 1
            return ""
        return (reply.system_fingerprint or "")[4:]

    def pace(seconds: float) -> list[tuple[float, str]]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            out.append((started, one()))
            time.sleep(max(0.0, every - (time.monotonic() - started)))
        return out

    pace(2.0)
    _behave(a, "503")
    pace(outage)
    _behave(a, "ok?tokens=4")
    recovered = time.monotonic()
    after = pace(20.0)
    back = [when - recovered for when, who in after if who == a_name]
    return (back[0] if back else float("inf")), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--outage", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=0.5)
    args = parser.parse_args(argv)
    procs = ProcessGroup()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            for shape in ("group", "fallback"):
                times, errors = [], 0
                for run in range(args.runs):
                    a_name = f"a-{shape}-{run}"
                    a = _sim(procs, workdir, a_name)
                    b = _sim(procs, workdir, f"b-{shape}-{run}")
                    url = _gateway(procs, workdir, shape, a, b)
                    api = openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0)
                    back, errs = _run(api, a, a_name, args.outage, args.every)
                    times.append(back)
                    errors += errs
                    print(
                        f"{shape} run {run + 1}: back after {back:.2f} s, {errs} errors", flush=True
                    )
                    procs.stop_all()
                print(
                    f"{shape}: median {statistics.median(times):.2f} s, worst "
                    f"{max(times):.2f} s over {args.runs} runs; client errors {errors}"
                )
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

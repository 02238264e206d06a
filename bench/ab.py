"""Two versions of Ballast side by side: this checkout against another source tree (a
`git worktree` of the commit to compare with), in front of the same nginx upstream, with
wrk runs in adjacent pairs whose order alternates. The median of the pairs' ratios is the
figure to read: the machine's speed drifts by several percent within minutes, and a pair
sees the same drift on both sides.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/ab.py --base-src /tmp/base/src [--pairs 6] [--seconds 4]
    .venv/bin/python bench/ab.py --base-src /tmp/base/src --stream --connections 8

`--stream`: streams/s of streamed chat completions (bench/stream_client.py) instead of
wrk's short requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

import targets as tg
from load import run_wrk
from procs import ProcessGroup, free_port, signals_as_interrupt
from run import run_streams

REPO_SRC = tg.REPO / "src"


def _start(procs: ProcessGroup, workdir: Path, upstream: tg.Upstream, name: str, src: Path) -> str:
    port = free_port()
    conf = workdir / f"{name}.yaml"
    # Each tree its own database and journal: an older tree cannot open a database a newer
    # one migrated, and the default ones are in the directory the bench is run from.
    state = {
        "database_url": f"sqlite+aiosqlite:///{workdir / name}.db",
        "spend_journal": str(workdir / f"{name}-spend.journal"),
    }
    config = tg.ballast_config(port, upstream, {"state": state})
    conf.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [sys.executable, "-m", "ballast", "serve", "--config", str(conf)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--log-level", "warning"]
    target = tg._serve(
        procs, name, cmd, workdir / f"{name}.log", {"PYTHONPATH": str(src)}, port, name
    )
    if not target.ok:
        raise SystemExit(f"{name}: {target.unavailable}")
    return target.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-src", type=Path, required=True, help="the other tree's src/")
    parser.add_argument(
        "--this-src", type=Path, default=REPO_SRC, help="the tree to measure (default: this one)"
    )
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument(
        "--this-first", action="store_true", help="start this tree's server first (a check)"
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--stream", action="store_true", help="streams/s, not short requests")
    args = parser.parse_args(argv)
    procs = ProcessGroup()
    with tempfile.TemporaryDirectory() as tmp, signals_as_interrupt():
        try:
            return _compare(procs, Path(tmp), args)
        finally:
            procs.stop_all()


def _compare(procs: ProcessGroup, workdir: Path, args: argparse.Namespace) -> int:
    upstream = tg.start_nginx(procs, workdir)
    sources = {"base": args.base_src.resolve(), "this": args.this_src.resolve()}
    order = ["this", "base"] if args.this_first else ["base", "this"]
    urls = {name: _start(procs, workdir, upstream, name, sources[name]) for name in order}
    unit = "streams/s" if args.stream else "req/s"

    def rate(url: str, seconds: float) -> float:
        if args.stream:
            return run_streams(url, args.connections, seconds).streams_per_s
        return run_wrk(url, args.connections, seconds).rps

    for url in urls.values():  # warm both before measuring
        rate(url, 1)
    ratios = []
    for i in range(args.pairs):
        order = ["this", "base"] if i % 2 == 0 else ["base", "this"]
        rps = {n: rate(urls[n], args.seconds) for n in order}
        ratios.append(rps["this"] / rps["base"])
        print(
            f"pair {i + 1}: this {rps['this']:,.0f} base {rps['base']:,.0f} {unit} "
            f"ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(
        f"this / base @{args.connections}: median {statistics.median(ratios):.3f} "
        f"(range {min(ratios):.3f}-{max(ratios):.3f}, {args.pairs} pairs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

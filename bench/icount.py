"""Instructions per request of the hot path, counted by valgrind's callgrind: the figure to
compare two versions of a change by when the machine is too busy for timings to tell a few
per cent apart. The same tree gives the same count to within about 1 % whatever else runs;
with --keys to within about 2 %, because the spend flush runs on a wall-clock timer.

    .venv/bin/python bench/icount.py                    # non-streaming, this tree's src/
    .venv/bin/python bench/icount.py --stream
    .venv/bin/python bench/icount.py --stream --shape responses   # a shape against chat's
    .venv/bin/python bench/icount.py --keys --src ../old/src

It runs `cpu.py` (Ballast's ASGI app called in-process against the nginx upstream) under
callgrind twice, with a small and a large number of requests, and divides the difference of
the two totals by the difference of the counts, so start-up and warm-up cancel out. The two
runs go side by side; together they take about two minutes.

What it counts: user-space instructions of every thread of the process (the database
driver's thread included). What it cannot see: work in the kernel (system calls, loopback
TCP), the HTTP server (cpu.py calls the app directly), and threads slowing each other down;
for those, time `bench/run.py` or `cpu.py`. Needs valgrind (Debian: `apt-get install -y
valgrind`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from cpu import SHAPES

BENCH = Path(__file__).resolve().parent
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="streamed chat completions")
    parser.add_argument(
        "--shape",
        default="chat",
        choices=sorted(SHAPES),
        help="the API asked, as cpu.py's --shape (a shape's count beside chat's is the"
        " steady figure for what its translation costs)",
    )
    parser.add_argument("--keys", action="store_true", help="keys, limits, budget and spend")
    parser.add_argument("--redis", metavar="URL", help="with --keys: limits and spend in Redis")
    parser.add_argument("--src", type=Path, help="Ballast's src/ (default: this tree's)")
    parser.add_argument("--small", type=int, default=800, help="requests in the short run")
    parser.add_argument("--large", type=int, default=4000, help="requests in the long run")
    args = parser.parse_args()
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    return args


def command(args: argparse.Namespace, requests: int) -> list[str]:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, str(BENCH / "cpu.py"), "--phases", "1", "--requests", str(requests)]
    if args.stream:
        cmd.append("--stream")
    if args.shape != "chat":
        cmd += ["--shape", args.shape]
    if args.keys:
        cmd.append("--keys")
    if args.redis:
        cmd += ["--redis", args.redis]
    if args.src:
        cmd += ["--src", str(args.src)]
    return cmd


def collected(stderr: str) -> int:
    found = COLLECTED.search(stderr)
    if found is None:
        raise SystemExit("callgrind reported no total:\n" + stderr[-2000:])
    return int(found.group(1))


def main() -> int:
    args = parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install -y valgrind (Debian)")
    runs = [
        subprocess.Popen(command(args, n), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for n in (args.small, args.large)
    ]
    totals = []
    for run in runs:
        out, err = run.communicate(timeout=1800)
        if run.returncode != 0:
            raise SystemExit(f"cpu.py failed under callgrind:\n{(out + err).decode()[-2000:]}")
        totals.append(collected(err.decode()))
    per_request = (totals[1] - totals[0]) / (args.large - args.small)
    kind = "stream" if args.stream else "request"
    variant = "open" if not args.keys else "keys, Redis" if args.redis else "keys, SQLite"
    if args.shape != "chat":
        variant += f", {args.shape}"
    src = args.src or BENCH.parent / "src"
    print(f"instructions per {kind}: {per_request:,.0f} ({variant}, src {src})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

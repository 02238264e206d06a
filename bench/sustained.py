"""Sustained load: the highest requests/s each target holds with a 20 ms upstream, at p99
under 1 s and under 0.1 % errors.

    .venv/bin/python bench/sustained.py                          # every target
    .venv/bin/python bench/sustained.py --targets direct,ballast --out r.md

Whole chat completions from bench/tick_upstream.py, each answered 20 ms after its request
(a short generation). wrk, one thread, at rising connection counts (8, 16, ... 4,096, a few
seconds each); every target runs each step in turn, so the targets share the machine's
moods. A target's climb ends at its first step past a bound (p99 >= 1 s, or errors >= 0.1 %:
non-2xx answers, timeouts, broken connections); its figure is the highest requests/s of the
steps it held. wrk is closed-loop: a request waits for the one before it on its connection,
so the figure is the throughput a target keeps while its queueing stays under the bound.
Every server listens on loopback and is stopped on exit. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import resource
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import long_streams
import targets as tg
from load import WrkResult, run_wrk
from procs import ProcessGroup, cpu_seconds, signals_as_interrupt

ANSWER_DELAY = 0.02
STEPS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
P99_BOUND_MS = 1000.0
ERROR_BOUND = 0.001


@dataclass
class Step:
    target: str
    connections: int
    result: WrkResult
    cpu_s: float

    @property
    def error_share(self) -> float:
        total = self.result.requests + self.result.errors
        return self.result.errors / total if total else 1.0

    @property
    def held(self) -> bool:
        return self.result.p99_ms < P99_BOUND_MS and self.error_share < ERROR_BOUND


def climb(found: dict[str, tg.Target], steps: tuple[int, ...], seconds: float) -> list[Step]:
    """Every still-climbing target at each step, in turn."""
    climbing = [t for t in found.values() if t.ok]
    done: list[Step] = []
    for connections in steps:
        for target in list(climbing):
            cpu = cpu_seconds(target.pid)
            result = run_wrk(
                target.url, connections, seconds, target.key, target.shape, target.headers
            )
            step = Step(target.name, connections, result, cpu_seconds(target.pid) - cpu)
            done.append(step)
            print(
                f"{target.name} c={connections}: {result.rps:,.0f} req/s, p99 "
                f"{result.p99_ms:.1f} ms, errors {result.errors}"
                + ("" if step.held else "  (past a bound: its climb ends)"),
                flush=True,
            )
            if not step.held:
                climbing.remove(target)
        if not climbing:
            break
    return done


def report(steps: list[Step], found: dict[str, tg.Target], seconds: float) -> str:
    lines = [
        f"## Sustained load ({datetime.date.today().isoformat()})",
        "",
        f"`python bench/sustained.py`: whole chat completions answered {ANSWER_DELAY * 1e3:.0f}"
        f" ms after their request (bench/tick_upstream.py), wrk at rising connections, "
        f"{seconds:.0f} s a step, the targets in turn at each. Machine: {platform.machine()},"
        f" {long_streams._cores()} cores shared with other work, Python "
        f"{platform.python_version()}, Linux {platform.release()}.",
        "",
        f"Held: p99 under {P99_BOUND_MS:.0f} ms and errors under {ERROR_BOUND:.1%}.",
        "",
        "| target | highest req/s held | at connections | p50 / p99 ms there "
        "| CPU ms/req there | first step past a bound |",
        "|---|---|---|---|---|---|",
    ]
    for name in found:
        mine = [s for s in steps if s.target == name]
        held = [s for s in mine if s.held]
        failed = next((s for s in mine if not s.held), None)
        if failed is None:
            past = "none up to the last step"
        elif not failed.result.requests:
            past = f"c={failed.connections}: no answer completed within the step"
        else:
            past = (
                f"c={failed.connections}: {failed.result.rps:,.0f} req/s, p99 "
                f"{failed.result.p99_ms:,.0f} ms, {failed.error_share:.2%} errors"
            )
        if not held:
            lines.append(f"| {name} | none | – | – | – | {past} |")
            continue
        best = max(held, key=lambda s: s.result.rps)
        per_request = best.cpu_s / best.result.requests * 1e3 if best.result.requests else 0.0
        lines.append(
            f"| {name} | {best.result.rps:,.0f} | {best.connections} "
            f"| {best.result.p50_ms:.1f} / {best.result.p99_ms:.1f} | {per_request:.3f} "
            f"| {past} |"
        )
    lines += ["", "Every step:", ""]
    lines += ["| target | connections | req/s | p50 ms | p99 ms | errors | held |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for s in steps:
        lines.append(
            f"| {s.target} | {s.connections} | {s.result.rps:,.0f} | {s.result.p50_ms:.1f} "
            f"| {s.result.p99_ms:.1f} | {s.result.errors} | {'yes' if s.held else 'no'} |"
        )
    lines += ["", "Targets:", ""]
    lines += [f"- {t.name}: {t.note or t.unavailable}" for t in found.values()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", default=",".join(long_streams.TARGETS))
    parser.add_argument("--seconds", type=float, default=4.0, help="each step's length")
    parser.add_argument("--steps", default=",".join(str(s) for s in STEPS))
    parser.add_argument("--out", type=Path, help="append the tables to this file")
    args = parser.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # wrk and the servers inherit it
    steps = tuple(int(n) for n in args.steps.split(","))
    names = [n for n in args.targets.split(",") if n]
    done: list[Step] = []
    found: dict[str, tg.Target] = {}
    with tempfile.TemporaryDirectory(prefix="ballast-sustained-") as tmp, signals_as_interrupt():
        workdir = Path(tmp)
        procs = ProcessGroup()
        try:
            upstream = long_streams.start_tick(procs, workdir, "--answer-delay", str(ANSWER_DELAY))
            found = {name: long_streams.start(name, procs, workdir, upstream) for name in names}
            for name, target in found.items():
                print(f"{name}: {target.url or 'UNAVAILABLE ' + target.unavailable}")
            done = climb(found, steps, args.seconds)
        except KeyboardInterrupt:
            print("interrupted")
        finally:
            procs.stop_all()
    long_streams.publish(report(done, found, args.seconds), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ballast benchmark: direct nginx vs the bare pass-through vs Ballast vs Portkey vs LiteLLM,
one run.

    .venv/bin/python bench/run.py --quick                  # ~2 minutes
    .venv/bin/python bench/run.py --out bench/results.md   # full run, ~10 minutes

Every server listens on a free loopback port and is stopped on exit (Ctrl-C included).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import targets as tg
from load import run_wrk, wrk_path
from procs import ProcessGroup, alive, cpu_seconds, peak_rss_mb, signals_as_interrupt, wait_idle
from report import Results, render
from stream_client import StreamResult

CONNECTIONS = [1, 8, 32, 64]
CONCURRENCIES = [8, 32]
# The ratio targets, measured again in adjacent pairs (see `measure_pairs`): the variant,
# its baseline, and the connections each gets (two workers: the same 32 per worker).
PAIRS = [
    ("ballast+keys", "ballast", 32, 32),
    ("ballast+keys+redis", "ballast", 32, 32),
    ("ballast-2w", "ballast", 64, 32),
    ("ballast-messages", "ballast", 32, 32),
    ("ballast-messages-native", "ballast", 32, 32),
    ("ballast-responses", "ballast", 32, 32),
    ("ballast-anthropic", "ballast", 32, 32),
]
# The streamed ratio targets, paired the same way at every concurrency: a shape's streams
# against chat's.
STREAM_PAIRS = [
    ("ballast-messages-native", "ballast"),
    ("ballast-messages", "ballast"),
    ("ballast-responses", "ballast"),
]


@dataclass(frozen=True)
class Plan:
    wrk_seconds: float
    stream_seconds: float
    repeats: int
    budget_seconds: float  # measuring stops starting new repetitions past this
    pair_rounds: int  # adjacent pairs per ratio target
    pair_seconds: float

    @staticmethod
    def of(args: argparse.Namespace) -> Plan:
        plan = Plan(3, 2, 1, 150, 2, 3) if args.quick else Plan(8, 3, 3, 540, 7, 4)
        return Plan(
            args.duration or plan.wrk_seconds,
            args.stream_duration or plan.stream_seconds,
            args.repeats or plan.repeats,
            plan.budget_seconds,
            plan.pair_rounds if args.pairs is None else args.pairs,
            plan.pair_seconds,
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Ballast side-by-side benchmark")
    parser.add_argument("--quick", action="store_true", help="short run (~2 minutes)")
    parser.add_argument(
        "--targets",
        default="direct,bare,ballast,ballast+keys,ballast+keys+redis,portkey,litellm",
        help=f"comma-separated, from {','.join(tg.ALL_TARGETS)}",
    )
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument(
        "--ballast-config-extra",
        type=Path,
        help="YAML merged into Ballast's config for an extra 'ballast+extra' target",
    )
    parser.add_argument("--duration", type=float, help="seconds per wrk run")
    parser.add_argument("--stream-duration", type=float, help="seconds per streaming run")
    parser.add_argument("--repeats", type=int, help="repetitions per cell (median is kept)")
    parser.add_argument(
        "--pairs", type=int, help="adjacent pairs per ratio target (0: ratios from cells only)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp dir of logs")
    args = parser.parse_args(argv)
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.ballast_config_extra and "ballast+extra" not in names:
        names.append("ballast+extra")
    unknown = [n for n in names if n not in (*tg.ALL_TARGETS, "ballast+extra")]
    if unknown:
        parser.error(f"unknown target(s) {unknown}; choose from {tg.ALL_TARGETS}")
    if "ballast+extra" in names and not args.ballast_config_extra:
        parser.error("ballast+extra needs --ballast-config-extra FILE")
    if "direct" not in names:
        names.insert(0, "direct")  # every added-latency figure is against direct
    args.names = names
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def start_targets(
    names: list[str], procs: ProcessGroup, workdir: Path, args: argparse.Namespace
) -> tuple[tg.Upstream, list[tg.Target]]:
    upstream = tg.start_nginx(procs, workdir)
    _log(f"nginx upstream on :{upstream.port}")
    started: list[tg.Target] = []
    for name in names:
        if name == "direct":
            target = tg.direct(upstream)
        elif name == "bare":
            target = tg.bare(procs, workdir, upstream)
        elif name == "ballast":
            target = tg.ballast(procs, workdir, upstream)
        elif name == "ballast-2w":
            target = tg.ballast(procs, workdir, upstream, name=name, workers=2)
        elif name == "ballast-assemble":
            target = tg.ballast(procs, workdir, upstream, name=name, assemble=True)
        elif name == "ballast-messages":
            target = tg.ballast_messages(procs, workdir, upstream)
        elif name == "ballast-messages-native":
            target = tg.ballast_messages_native(procs, workdir, upstream)
        elif name == "ballast-responses":
            target = tg.ballast_responses(procs, workdir, upstream)
        elif name == "ballast-anthropic":
            target = tg.ballast(procs, workdir, upstream, name=name, anthropic=True)
        elif name == "ballast-granian":
            target = tg.ballast_granian(procs, workdir, upstream)
        elif name == "ballast+keys":
            target = tg.ballast_with_keys(procs, workdir, upstream, name, None)
        elif name == "ballast+keys+redis":
            target = _with_redis(procs, workdir, upstream, name)
        elif name == "ballast+extra":
            extra: dict[str, Any] = yaml.safe_load(args.ballast_config_extra.read_text()) or {}
            target = tg.ballast(procs, workdir, upstream, name=name, extra=extra)
        elif name == "portkey":
            target = tg.portkey(procs, workdir, upstream)
        else:
            target = tg.litellm(procs, workdir, upstream)
        _log(f"{name}: " + (target.url or f"UNAVAILABLE ({target.unavailable})"))
        started.append(target)
    return upstream, started


def _with_redis(procs: ProcessGroup, workdir: Path, upstream: tg.Upstream, name: str) -> tg.Target:
    missing = tg.redis_missing()
    if missing:
        return tg.Target(name, unavailable=missing)
    try:
        url = tg.start_redis(procs, workdir)
    except RuntimeError as exc:
        return tg.Target(name, unavailable=str(exc).splitlines()[0])
    return tg.ballast_with_keys(procs, workdir, upstream, name, url)


def run_streams(
    url: str,
    concurrency: int,
    seconds: float,
    key: str = "sk-bench",
    shape: str = "openai",
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """The streaming client in its own interpreter, so it never shares our event loop."""
    cmd = [sys.executable, str(Path(__file__).with_name("stream_client.py")), url]
    cmd += ["--concurrency", str(concurrency), "--duration", str(seconds), "--key", key]
    cmd += ["--shape", shape]
    for name, value in (headers or {}).items():
        cmd += ["--header", f"{name}: {value}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 90, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"stream client failed: {done.stderr.strip()[-500:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data.pop("streams_per_s", None)
    return StreamResult(**data)


def _rotate(items: list[tg.Target], by: int) -> list[tg.Target]:
    if not items:
        return items
    k = by % len(items)
    return items[k:] + items[:k]


def _drop_dead(live: list[tg.Target], res: Results) -> list[tg.Target]:
    """Targets whose server died or failed a run are reported, not measured further."""
    for t in live:
        if t.name not in res.failed and not alive(t.pid):
            res.failed[t.name] = "server process died during the run"
    for t in live:
        if t.name in res.failed:
            _log(f"{t.name}: dropped: {res.failed[t.name]}")
    return [t for t in live if t.name not in res.failed]


_RUN_ERRORS = (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired)


def _note_rss(t: tg.Target, res: Results) -> None:
    """VmHWM is a lifetime peak, but a process that dies takes it along: sample often."""
    res.rss_mb[t.name] = max(res.rss_mb.get(t.name, 0.0), peak_rss_mb(t.pid))


def _wrk_cell(t: tg.Target, conns: int, plan: Plan, res: Results, tag: str) -> None:
    before = cpu_seconds(t.pid)
    try:
        result = run_wrk(t.url, conns, plan.wrk_seconds, t.key, t.shape, t.headers)
    except _RUN_ERRORS as exc:
        res.failed[t.name] = f"wrk at {conns} connections: {exc}".splitlines()[0]
        return
    wait_idle(t.pid)
    _note_rss(t, res)
    cpu_ms = max(0.0, cpu_seconds(t.pid) - before) * 1e3 / max(1, result.requests)
    res.wrk.setdefault((t.name, conns), []).append((result, cpu_ms))
    _log(
        f"{tag} {t.name:>12} c={conns:<3} {result.rps:>9.0f} req/s "
        f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms err {result.errors}"
    )


def _stream_cell(t: tg.Target, conc: int, plan: Plan, res: Results, tag: str) -> None:
    try:
        stream = run_streams(
            t.stream_url, conc, plan.stream_seconds, t.key, t.shape, t.stream_headers
        )
    except _RUN_ERRORS as exc:
        res.failed[t.name] = f"streaming at {conc} concurrent: {exc}".splitlines()[0]
        return
    wait_idle(t.pid)
    _note_rss(t, res)
    res.streams.setdefault((t.name, conc), []).append(stream)
    _log(
        f"{tag} {t.name:>12} s={conc:<3} {stream.streams_per_s:>9.0f} streams/s "
        f"TTFC p50 {stream.ttfc_p50_ms:.2f} ms err {stream.errors}"
    )


def measure(live: list[tg.Target], res: Results, plan: Plan) -> None:
    started = time.monotonic()
    for t in live:  # warm pools and caches; not recorded
        try:
            run_wrk(t.url, 8, 1, t.key, t.shape, t.headers)
            run_streams(t.stream_url, 8, 0.5, t.key, t.shape, t.stream_headers)
        except _RUN_ERRORS as exc:
            res.failed[t.name] = f"warm-up: {exc}".splitlines()[0]
        wait_idle(t.pid)
    for rep in range(plan.repeats):
        if rep and time.monotonic() - started > plan.budget_seconds:
            _log(f"time budget reached: {rep} repetition(s) kept")
            break
        res.repetitions = rep + 1
        tag = f"[{rep + 1}/{plan.repeats}]"
        for i, conns in enumerate(res.connections):
            live = _drop_dead(live, res)
            for t in _rotate(live, rep + i):
                _wrk_cell(t, conns, plan, res, tag)
        for i, conc in enumerate(res.concurrencies):
            live = _drop_dead(live, res)
            for t in _rotate(live, rep + i + 1):
                _stream_cell(t, conc, plan, res, tag)
    _drop_dead(live, res)


def measure_pairs(live: list[tg.Target], res: Results, plan: Plan) -> None:
    """The ratio targets once more, as adjacent pairs: the variant and its baseline back to
    back, in alternating order, and the median of the pairs' ratios. On a shared machine
    the speed drifts by several percent within minutes, and two cells of the matrix above
    can be minutes apart; a pair's two runs are seconds apart, so the drift mostly cancels
    in its ratio."""
    for variant, baseline, v_conns, b_conns in PAIRS:
        live = _drop_dead(live, res)
        rate = _wrk_rate(plan, {variant: v_conns, baseline: b_conns})
        ratios = _paired(live, res, plan, variant, baseline, rate, f"wrk @{v_conns}")
        res.pairs.setdefault((variant, baseline), []).extend(ratios)
    for variant, baseline in STREAM_PAIRS:
        for conc in res.concurrencies:
            live = _drop_dead(live, res)
            rate = _stream_rate(plan, conc)
            ratios = _paired(live, res, plan, variant, baseline, rate, f"streams @{conc}")
            res.stream_pairs.setdefault((variant, baseline, conc), []).extend(ratios)


def _wrk_rate(plan: Plan, conns: dict[str, int]) -> Callable[[tg.Target], float]:
    """A target's req/s at its connections in `conns`, for one pair."""

    def rate(t: tg.Target) -> float:
        return run_wrk(t.url, conns[t.name], plan.pair_seconds, t.key, t.shape, t.headers).rps

    return rate


def _stream_rate(plan: Plan, conc: int) -> Callable[[tg.Target], float]:
    """A target's streams/s at `conc` concurrent, for one pair."""

    def rate(t: tg.Target) -> float:
        return run_streams(
            t.stream_url, conc, plan.stream_seconds, t.key, t.shape, t.stream_headers
        ).streams_per_s

    return rate


def _paired(
    live: list[tg.Target],
    res: Results,
    plan: Plan,
    variant: str,
    baseline: str,
    rate: Callable[[tg.Target], float],
    what: str,
) -> list[float]:
    """`plan.pair_rounds` adjacent pairs of `rate` (a target's req/s or streams/s): the
    variant's over its baseline's, one per pair."""
    by_name = {t.name: t for t in live}
    ratios: list[float] = []
    for rnd in range(plan.pair_rounds):
        live = _drop_dead(live, res)
        if {variant, baseline} - {t.name for t in live}:
            break
        order = [baseline, variant]
        rates: dict[str, float] = {}
        for name in order if rnd % 2 == 0 else order[::-1]:
            t = by_name[name]
            try:
                rates[name] = rate(t)
            except _RUN_ERRORS as exc:
                res.failed[name] = f"paired {what}: {exc}".splitlines()[0]
                return ratios
            wait_idle(t.pid)
        if rates[baseline]:
            ratios.append(rates[variant] / rates[baseline])
            tag = f"[pair {rnd + 1}/{plan.pair_rounds}]"
            _log(f"{tag} {variant} / {baseline} ({what}): {ratios[-1]:.3f}")
    return ratios


def _version(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "?"
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else "?"


def _wrk_version() -> str:
    words = _version([wrk_path(), "-v"]).split()
    return " ".join(words[:2])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def header(plan: Plan, res: Results, quick: bool) -> list[str]:
    litellm = tg.litellm_installed_version() if "litellm" in res.targets else ""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## Ballast benchmark ({'quick' if quick else 'full'} run, {when})",
        "",
        f"- Machine: {_cpu_model()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}",
        f"- Upstream: {_version(['nginx', '-v'])} (fixed answer, 1 worker); "
        f"load: {_wrk_version()} + aiohttp streaming client",
        f"- Each cell: wrk {plan.wrk_seconds:g} s / streams {plan.stream_seconds:g} s, "
        f"median of {res.repetitions or plan.repeats} repetition(s), targets interleaved in "
        "rotating order",
        f"- Ratio targets: also {plan.pair_rounds} adjacent pairs each (wrk "
        f"{plan.pair_seconds:g} s or streams {plan.stream_seconds:g} s, variant and baseline "
        "back to back, order alternating); "
        "the check reads the median of the pairs' ratios and shows the cells' ratio beside it",
        "- One worker per gateway unless the name says otherwise; added latency = target "
        "minus direct in the same run; CPU ms/req = the target's process tree user+system "
        "CPU / requests; peak RSS = sum of VmHWM over the target's process tree",
    ]
    if "litellm" in res.targets:
        pinned = tg.LITELLM_VERSION
        shown = litellm or "not installed"
        extra = "" if shown == pinned else f" (pinned {pinned})"
        lines.append(
            f"- LiteLLM proxy {shown}{extra}: 1 worker, no database, priced models, "
            "master key auth (it will not start without one)"
        )
    if "portkey" in res.targets:
        lines.append(
            f"- Portkey's gateway {tg.PORTKEY_VERSION} on Node (hono 4.9.7 and @hono/node-server"
            " 1.13.5, as its lockfile pins them), 1 process, bound to loopback"
        )
    if res.load_before:
        lines.append(
            f"- Machine load average (1 min) at start {res.load_before:.2f}, at end "
            f"{os.getloadavg()[0]:.2f}: other work on the machine skews absolute numbers; "
            "ratios from the same run are the figures to read"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.of(args)
    wrk_path()
    if not shutil.which("nginx"):
        raise SystemExit("nginx is not installed: apt-get install -y nginx (as root, Debian)")
    workdir = Path(tempfile.mkdtemp(prefix="ballast-bench-"))
    res = Results(CONNECTIONS, CONCURRENCIES, list(args.names))
    res.load_before = os.getloadavg()[0]
    procs = ProcessGroup()
    failed = True
    try:
        with signals_as_interrupt():
            _, started = start_targets(args.names, procs, workdir, args)
            live = [t for t in started if t.ok]
            for t in started:
                if not t.ok:
                    res.unavailable[t.name] = t.unavailable
                elif t.note:
                    res.notes[t.name] = t.note
            measure(live, res, plan)
            measure_pairs(live, res, plan)
            for t in live:
                _note_rss(t, res)
        failed = False
    except KeyboardInterrupt:
        _log("interrupted: stopping servers")
        return 130
    finally:
        procs.stop_all()
        if failed or args.keep_logs:
            _log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    text = render(res, header(plan, res, args.quick))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
        _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

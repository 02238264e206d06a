"""Long streams: N concurrent 200-token answers, one token every 20 ms (bench/
tick_upstream.py), through each gateway in turn, interleaved, in one run.

    .venv/bin/python bench/long_streams.py                       # N = 100, 500
    .venv/bin/python bench/long_streams.py --streams 100,500,1000,2000 --out r.md

Each token carries the time the upstream wrote it (CLOCK_MONOTONIC, shared by every
process here), so the client knows how long it took to arrive: `added` is that latency
beyond direct's (the client's own share) in the same round. Also per target and N: time to
first token, errors, the gateway's CPU per token and per stream (its process tree, from
/proc), its peak RSS above idle per stream, and `/health` latency while it streams (a
view of its event-loop lag). The client is one Python process: at large N its own loop
lateness is in every target's figures, direct's too. Every server listens on loopback and
is stopped on exit. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import resource
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import uvloop

import targets as tg
from procs import (
    ProcessGroup,
    cpu_seconds,
    free_port,
    signals_as_interrupt,
    system_cpu_seconds,
    tree_pids,
    wait_ready,
)

TOKENS = 200
SPACING = 0.02
STAMP = b'"content":"'
BODY = b'{"model":"bench-stream","stream":true,"messages":[{"role":"user","content":"hi"}]}'
BALLAST_EXTRA = {"upstream": {"pool_size": 10000}, "server": {"max_in_flight": 100000}}
TARGETS = ("direct", "nginx-proxy", "bare", "ballast", "ballast-2w", "portkey", "litellm")


@dataclass
class Round:
    target: str
    streams: int
    ok: int = 0
    errors: int = 0
    first_error: str = ""
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)  # seconds
    latency: list[int] = field(default_factory=list)  # ns, upstream write -> client read
    cpu_s: float = 0.0
    system_s: float = 0.0  # the kernel's share of cpu_s
    peak_mb: float = 0.0
    idle_mb: float = 0.0
    health_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    load_s: float = 0.0  # CPU seconds of the client (this process) and the upstream
    busy_s: float = 0.0  # CPU seconds the whole machine was busy, all cores
    steal_s: float = 0.0  # CPU seconds the host gave to other guests instead
    spans: list[tuple[float, float]] = field(default_factory=list)  # first token, end (s)

    def peak_streaming(self) -> int:
        """The most streams that were past their first token and not yet ended at one
        moment: how many the target really carried at once (one that is slow to accept or
        answer spreads its N over a longer time)."""
        moments = [(first, 1) for first, _ in self.spans] + [(end, -1) for _, end in self.spans]
        current = peak = 0
        for _, step in sorted(moments):
            current += step
            peak = max(peak, current)
        return peak


class StreamClient(asyncio.Protocol):
    """One stream: the request, then every token's arrival against its stamp."""

    def __init__(self, head: bytes, result: Round, done: asyncio.Future[None]) -> None:
        self.head = head
        self.result = result
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.started = 0.0
        self.first_at = 0.0
        self.first = False
        self.count = 0
        self.carry = b""
        self.finished = False
        self.refusal = b""  # the start of a non-200 answer's body, to say why
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.started = time.monotonic()
        transport.write(self.head + BODY)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"bad HTTP: {exc}")

    def on_body(self, body: bytes) -> None:
        now = time.monotonic_ns()
        if self.parser.get_status_code() != 200:
            self.refusal = (self.refusal + body)[:200]
            return
        data = self.carry + body if self.carry else body
        at = data.find(STAMP)
        while at >= 0:
            start = at + len(STAMP)
            stamp = data[start : start + 19]
            if len(stamp) < 19:
                break
            if stamp.isdigit():
                if not self.first:
                    self.first = True
                    self.first_at = time.monotonic()
                    self.result.ttft.append(self.first_at - self.started)
                self.result.latency.append(now - int(stamp))
                self.count += 1
            at = data.find(STAMP, start)
        self.carry = data[at:] if at >= 0 else data[-40:]

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status != 200:
            why = self.refusal.decode("utf-8", "replace").replace("|", "/")
            self._fail(f"HTTP {status}: {why}" if why else f"HTTP {status}")
        elif self.count < TOKENS:
            self._fail(f"{self.count} tokens of {TOKENS}")
        else:
            self.finished = True
            self.result.ok += 1
            self.result.tokens += self.count
            self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished:
            self._fail(f"connection lost after {self.count} tokens")

    def _fail(self, why: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.result.errors += 1
        self.result.tokens += self.count
        self.result.first_error = self.result.first_error or why
        self._end()

    def _end(self) -> None:
        if self.first:
            self.result.spans.append((self.first_at, time.monotonic()))
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)


async def _one(host: str, port: int, head: bytes, result: Round, delay: float) -> None:
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    client = StreamClient(head, result, done)
    try:
        await loop.create_connection(lambda: client, host, port)
        await asyncio.wait_for(asyncio.shield(done), TOKENS * SPACING + 60)
    except (OSError, TimeoutError) as exc:
        client._fail(f"no end within {TOKENS * SPACING + 60:.0f} s" if not exc.args else repr(exc))


def _head(url: str, target: tg.Target) -> tuple[str, int, bytes]:
    rest = url.split("://", 1)[1]
    hostport, path = rest.split("/", 1)
    host, port = hostport.split(":")
    lines = [f"POST /{path} HTTP/1.1", f"host: {hostport}", "content-type: application/json"]
    lines += [f"authorization: Bearer {target.key}", f"content-length: {len(BODY)}"]
    lines += [f"{k}: {v}" for k, v in target.stream_headers.items()]
    return host, int(port), ("\r\n".join(lines) + "\r\n\r\n").encode()


def _rss_mb(root: int) -> float:
    total = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _watch(target: tg.Target, health: str, result: Round, stop: threading.Event) -> None:
    """Peak RSS of the target's processes and its health latency, every 100 ms."""
    while not stop.is_set():
        result.peak_mb = max(result.peak_mb, _rss_mb(target.pid))
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(health, timeout=5) as response:
                response.read()
            result.health_ms.append((time.perf_counter() - start) * 1e3)
        except OSError:
            result.health_ms.append(5000.0)
        stop.wait(0.1)


def _load_seconds(upstream_pid: int) -> float:
    """CPU seconds of what every target shares: this client and the upstream."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + cpu_seconds(upstream_pid)


def _machine_seconds() -> tuple[float, float]:
    """Busy and stolen CPU seconds of the whole machine so far (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def measure(target: tg.Target, health: str, streams: int, upstream_pid: int) -> Round:
    result = Round(target.name, streams)
    host, port, head = _head(target.stream_url, target)
    result.idle_mb = _rss_mb(target.pid)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(target, health, result, stop), daemon=True)
    cpu = cpu_seconds(target.pid)
    system = system_cpu_seconds(target.pid)
    load = _load_seconds(upstream_pid)
    busy, steal = _machine_seconds()
    started = time.monotonic()
    watcher.start()
    ramp = min(2.0, streams / 500)  # streams begin spread over this long

    async def all_streams() -> None:
        await asyncio.gather(
            *(_one(host, port, head, result, ramp * i / streams) for i in range(streams))
        )

    try:
        uvloop.run(all_streams())
    finally:
        stop.set()
        watcher.join(10)
    result.seconds = time.monotonic() - started
    result.cpu_s = cpu_seconds(target.pid) - cpu
    result.system_s = system_cpu_seconds(target.pid) - system
    result.load_s = _load_seconds(upstream_pid) - load
    busy_after, steal_after = _machine_seconds()
    result.busy_s, result.steal_s = busy_after - busy, steal_after - steal
    return result


def _pct(values: list[Any], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def start_tick(procs: ProcessGroup, workdir: Path, *options: str) -> tg.Upstream:
    """bench/tick_upstream.py on a free loopback port, with its command-line `options`."""
    port = free_port()
    cmd = [sys.executable, str(tg.BENCH / "tick_upstream.py"), str(port), *options]
    proc = procs.start(cmd, workdir / "tick.log")
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 20, workdir / "tick.log")
    return tg.Upstream(port, proc.pid)


def publish(table: str, out: Path | None) -> None:
    """Print the tables, and append them to `out` when given."""
    print(table)
    if out:
        with out.open("a") as file:
            file.write("\n" + table)


def start(name: str, procs: ProcessGroup, workdir: Path, upstream: tg.Upstream) -> tg.Target:
    if name == "direct":
        url = upstream.base + "/v1/chat/completions"
        return tg.Target("direct", url=url, stream_url=url, pid=upstream.pid, note="tick upstream")
    if name == "nginx-proxy":
        return tg.nginx_proxy(procs, workdir, upstream)
    if name == "bare":
        return tg.bare(procs, workdir, upstream)
    if name == "ballast":
        return tg.ballast(procs, workdir, upstream, extra=BALLAST_EXTRA)
    if name == "ballast-2w":
        return tg.ballast(procs, workdir, upstream, name=name, workers=2, extra=BALLAST_EXTRA)
    if name == "portkey":
        return tg.portkey(procs, workdir, upstream)
    return tg.litellm(procs, workdir, upstream)


def health_url(target: tg.Target) -> str:
    base = target.stream_url.split("/v1/", 1)[0].replace("/stream", "")
    if target.name == "litellm":
        return base + "/health/liveliness"
    if target.name == "portkey":
        return base + "/"
    return base + "/health"


def report(rounds: list[Round], targets: dict[str, tg.Target], args: argparse.Namespace) -> str:
    lines = [
        f"## Long streams ({datetime.date.today().isoformat()})",
        "",
        f"`python bench/long_streams.py --streams {args.streams}`: {TOKENS} tokens "
        f"{SPACING * 1e3:.0f} ms apart per stream (bench/tick_upstream.py). Machine: "
        f"{platform.machine()}, {_cores()} cores shared with other work (the CPU is "
        f"contended: compare targets within a round, not with other runs), Python "
        f"{platform.python_version()}, Linux {platform.release()}. One client process.",
        "",
        "Streaming at once: the most streams past their first token and not yet ended at one "
        "moment (a target slow to take streams on runs fewer of its N at a time). "
        "Latency: from the upstream writing a token to the client reading it; added: beyond "
        "direct's in the same round. CPU: the gateway's process tree, in user code and in the "
        "kernel (its socket calls). RSS: its peak above "
        "idle. Health: its `/health` (or root) answer time while streaming, p99. Load: the "
        "cores the client and the upstream used, on average over the round (every target "
        "shares them); machine: the cores the whole machine was busy, and those the host "
        "took for other guests (steal). When load and gateway together need more cores "
        "than the machine has, every figure of that round measures the machine.",
        "",
        "| target | N | ok | errors | TTFT p50 / p99 ms | streaming at once (peak) "
        "| latency p50 / p99 ms | added p50 / p99 ms | CPU µs/token (user + system) "
        "| CPU ms/stream | RSS MB/stream | peak RSS MB | health p99 ms "
        "| load cores | machine busy (steal) cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    direct = {r.streams: r for r in rounds if r.target == "direct"}
    for r in rounds:
        lat50 = _pct(r.latency, 0.5) / 1e6
        lat99 = _pct(r.latency, 0.99) / 1e6
        base = direct.get(r.streams)
        add50 = lat50 - _pct(base.latency, 0.5) / 1e6 if base else float("nan")
        add99 = lat99 - _pct(base.latency, 0.99) / 1e6 if base else float("nan")
        per_token = r.cpu_s / r.tokens * 1e6 if r.tokens else float("nan")
        kernel = r.system_s / r.tokens * 1e6 if r.tokens else float("nan")
        per_stream = r.cpu_s / r.streams * 1e3
        rss = max(0.0, r.peak_mb - r.idle_mb) / r.streams
        err = f"{r.errors}" + (f" ({r.first_error[:100]})" if r.errors else "")
        lines.append(
            f"| {r.target} | {r.streams} | {r.ok} | {err} "
            f"| {_pct(r.ttft, 0.5) * 1e3:.0f} / {_pct(r.ttft, 0.99) * 1e3:.0f} "
            f"| {r.peak_streaming()} | {lat50:.1f} / {lat99:.1f} | {add50:.1f} / {add99:.1f} "
            f"| {per_token:.0f} ({per_token - kernel:.0f} + {kernel:.0f}) | {per_stream:.1f} "
            f"| {rss:.3f} | {r.peak_mb:.0f} "
            f"| {_pct(r.health_ms, 0.99):.0f} | {r.load_s / r.seconds:.2f} "
            f"| {r.busy_s / r.seconds:.2f} ({r.steal_s / r.seconds:.2f}) |"
        )
    lines += ["", "Targets:", ""]
    lines += [f"- {t.name}: {t.note or t.unavailable}" for t in targets.values()]
    return "\n".join(lines) + "\n"


def _cores() -> int:
    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--streams", default="100,500", help="N values, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--out", type=Path, help="append the table to this file")
    args = parser.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    counts = [int(n) for n in args.streams.split(",")]
    names = [n for n in args.targets.split(",") if n]
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="ballast-long-") as tmp, signals_as_interrupt():
        workdir = Path(tmp)
        procs = ProcessGroup()
        try:
            pace = ["--tokens", str(TOKENS), "--spacing", str(SPACING)]
            upstream = start_tick(procs, workdir, *pace)
            targets = {name: start(name, procs, workdir, upstream) for name in names}
            for name, target in targets.items():
                print(f"{name}: {target.stream_url or 'UNAVAILABLE ' + target.unavailable}")
            for count in counts:  # interleaved: every target at one N, then the next N
                for target in targets.values():
                    if not target.ok:
                        continue
                    result = measure(target, health_url(target), count, upstream.pid)
                    rounds.append(result)
                    print(
                        f"{target.name} N={count}: ok {result.ok}, errors {result.errors}, "
                        f"p99 {_pct(result.latency, 0.99) / 1e6:.1f} ms, "
                        f"{result.seconds:.1f} s",
                        flush=True,
                    )
        except KeyboardInterrupt:
            print("interrupted")
        finally:
            procs.stop_all()
    publish(report(rounds, targets if rounds else {}, args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

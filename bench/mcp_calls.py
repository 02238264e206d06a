"""MCP tools/call through Ballast against a direct call to the same tool server, in one run.

One tool server (the official SDK, `mcp_tool_server.py`, a trivial `echo` tool) in a process
of its own, and Ballast (one worker, a master key) in front of it. At each concurrency the
same client calls the tool directly and through Ballast, in adjacent cells whose order
alternates from round to round, so the machine's drift falls on both sides alike. The
client is raw JSON-RPC over Streamable HTTP on one pooled aiohttp session per target: each
of the N workers initializes its own MCP session once, then sends its share of the calls
one after another. Prints p50 and p99 of each side, the p50 Ballast adds, and the ratio of
calls/s (the median of the rounds' ratios).

    .venv/bin/python bench/mcp_calls.py [--calls 1000] [--rounds 4] [--concurrency 1,8] [--sse]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

import targets as tg
from procs import ProcessGroup, cpu_seconds, free_port, signals_as_interrupt, wait_ready

VERSION = "2025-11-25"
SERVER = "bench"  # the tool server's name in Ballast's config: its tools are bench__<tool>
TEXT = "hello"
GOAL_MS = 1.0  # issue 38: p50 added <= 1 ms at 1 and 8 concurrent


@dataclass
class Side:
    """One way to the tool server: where to POST, the tool's name there, the headers."""

    name: str
    url: str
    tool: str
    pid: int  # the process tree whose CPU is charged to it
    headers: dict[str, str]
    latencies: dict[int, list[list[float]]] = field(default_factory=dict)  # a round's, s
    rates: dict[int, list[float]] = field(default_factory=dict)  # calls/s, per round
    cpu: dict[int, float] = field(default_factory=dict)  # its CPU seconds, per concurrency
    server_cpu: dict[int, float] = field(default_factory=dict)  # the tool server's
    calls: dict[int, int] = field(default_factory=dict)


class McpClient:
    """The MCP sessions of one side: one pooled HTTP session, a Streamable HTTP session per
    worker. Bodies are formatted bytes and answers parsed once, the same for both sides."""

    def __init__(self, side: Side, workers: int) -> None:
        self.side = side
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=workers, force_close=False),
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                **side.headers,
            },
        )
        self.sessions: list[str] = []
        self._ids = 0
        self._body = (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"'
            + side.tool.encode()
            + b'","arguments":{"text":"'
            + TEXT.encode()
            + b'"}}}'
        )

    async def open(self, workers: int) -> None:
        params = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "b"}}
        for _ in range(workers):
            body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
            async with self.http.post(self.side.url, data=orjson.dumps(body)) as response:
                await response.read()
                session = response.headers.get("mcp-session-id", "")
                if response.status != 200 or not session:
                    raise RuntimeError(f"{self.side.name}: initialize answered {response.status}")
            done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            async with self.http.post(
                self.side.url, data=orjson.dumps(done), headers=self._session(session)
            ) as response:
                await response.read()
            self.sessions.append(session)

    def _session(self, session: str) -> dict[str, str]:
        return {"mcp-session-id": session, "mcp-protocol-version": VERSION}

    async def call(self, headers: dict[str, str]) -> float:
        """One tools/call: its latency in seconds; RuntimeError unless the echo came back."""
        self._ids += 1
        id_ = self._ids
        started = time.perf_counter()
        async with self.http.post(self.side.url, data=self._body % id_, headers=headers) as r:
            raw = await r.read()
        elapsed = time.perf_counter() - started
        if r.status != 200:
            raise RuntimeError(f"{self.side.name}: HTTP {r.status}: {raw[:200]!r}")
        answer = _message(raw)
        result = answer.get("result") or {}
        content = result.get("content") or [{}]
        if answer.get("id") != id_ or result.get("isError") or content[0].get("text") != TEXT:
            raise RuntimeError(f"{self.side.name}: not the echo: {raw[:200]!r}")
        return elapsed

    async def run(self, calls: int) -> tuple[list[float], float]:
        """`calls` tools/call spread over the workers: latencies and the wall seconds."""
        share, extra = divmod(calls, len(self.sessions))

        async def worker(session: str, n: int) -> list[float]:
            headers = self._session(session)
            return [await self.call(headers) for _ in range(n)]

        started = time.perf_counter()
        done = await asyncio.gather(
            *(worker(s, share + (i < extra)) for i, s in enumerate(self.sessions))
        )
        return [x for lat in done for x in lat], time.perf_counter() - started

    async def close(self) -> None:
        await self.http.close()


def _message(raw: bytes) -> dict[str, Any]:
    """The JSON-RPC message of a JSON answer or of an SSE answer's data line."""
    if raw.startswith(b"{"):
        found: dict[str, Any] = orjson.loads(raw)
        return found
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            found = orjson.loads(line[5:])
            return found
    return {}


def start_tool_server(procs: ProcessGroup, workdir: Path, sse: bool) -> tuple[str, int]:
    port = free_port()
    log = workdir / "tool-server.log"
    cmd = [sys.executable, str(tg.BENCH / "mcp_tool_server.py"), str(port)]
    proc = procs.start([*cmd, "--sse"] if sse else cmd, log)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 30, log)
    return f"http://127.0.0.1:{port}/mcp", proc.pid


def start_ballast(
    procs: ProcessGroup, workdir: Path, tool_url: str, profile: Path | None
) -> tuple[str, int]:
    """Ballast, one worker, a master key, the tool server as its one MCP server (a chat
    model is required by the config; nothing calls it); under cProfile when `profile`
    names the file for its stats (written when it stops)."""
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port, "master_key": tg.BENCH_MASTER},
        "state": {"database_url": f"sqlite:///{workdir / 'ballast.db'}"},
        "models": [
            {
                "name": "unused",
                "deployments": [{"id": "unused", "url": tool_url + "/v1", "api_key": "sk-x"}],
            }
        ],
        "mcp": {"servers": [{"name": SERVER, "url": tool_url, "revision": VERSION}]},
    }
    conf = workdir / "ballast.yaml"
    conf.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [sys.executable, "-m", "ballast", "serve", "--config", str(conf)]
    if profile is not None:
        cmd[1:1] = ["-m", "cProfile", "-o", str(profile.resolve())]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--log-level", "warning"]
    log = workdir / "ballast.log"
    proc = procs.start(cmd, log, env={"PYTHONPATH": str(tg.REPO / "src")})
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 60, log)
    return f"http://127.0.0.1:{port}/mcp", proc.pid


async def measure(sides: list[Side], server_pid: int, args: argparse.Namespace) -> int:
    """The rounds, each side's cells adjacent; returns the rounds run."""
    levels = [int(c) for c in args.concurrency.split(",")]
    clients = {(s.name, c): McpClient(s, c) for s in sides for c in levels}
    try:
        for (_, c), client in clients.items():
            await client.open(c)
            await client.run(args.warmup)  # Ballast opens its upstream sessions here
        deadline = time.monotonic() + args.max_seconds
        rounds = 0
        while rounds < args.rounds and (rounds < 1 or time.monotonic() < deadline):
            order = sides if rounds % 2 == 0 else sides[::-1]
            for c in levels:
                for side in order:
                    cpu, server = cpu_seconds(side.pid), cpu_seconds(server_pid)
                    latencies, wall = await clients[side.name, c].run(args.calls)
                    side.cpu[c] = side.cpu.get(c, 0.0) + cpu_seconds(side.pid) - cpu
                    server = cpu_seconds(server_pid) - server
                    side.server_cpu[c] = side.server_cpu.get(c, 0.0) + server
                    side.latencies.setdefault(c, []).append(latencies)
                    side.rates.setdefault(c, []).append(len(latencies) / wall)
                    side.calls[c] = side.calls.get(c, 0) + len(latencies)
            rounds += 1
            print(f"round {rounds} done", file=sys.stderr, flush=True)
        return rounds
    finally:
        for client in clients.values():
            await client.close()


def _pct(rounds: list[list[float]], q: float) -> float:
    """The `q` quantile of every round's latencies together, in ms."""
    ordered = sorted(x for latencies in rounds for x in latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def report(direct: Side, ballast: Side, rounds: int, load: float, args: argparse.Namespace) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    answer = "an SSE stream" if args.sse else "one JSON object"
    lines = [
        f"MCP tools/call, {when}: {rounds} rounds of {args.calls} calls a cell "
        f"({args.warmup} warm-up calls first), the tool server answering {answer}; "
        f"{os.cpu_count()} CPUs, load average {load:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after",
        "",
        "| concurrent | direct p50 ms | direct p99 ms | Ballast p50 ms | Ballast p99 ms "
        "| added p50 ms (rounds' range) | calls/s direct | calls/s Ballast | ratio "
        "| Ballast CPU ms/call | tool server CPU ms/call, direct / via Ballast | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(direct.latencies):
        d50, d99 = _pct(direct.latencies[c], 0.5), _pct(direct.latencies[c], 0.99)
        b50, b99 = _pct(ballast.latencies[c], 0.5), _pct(ballast.latencies[c], 0.99)
        ratios = [b / d for b, d in zip(ballast.rates[c], direct.rates[c], strict=True)]
        cpu = ballast.cpu[c] / ballast.calls[c] * 1000
        served = [s.server_cpu[c] / s.calls[c] * 1000 for s in (direct, ballast)]
        verdict = "PASS" if b50 - d50 <= GOAL_MS else "MISS"
        added = [
            _pct([b], 0.5) - _pct([d], 0.5)
            for b, d in zip(ballast.latencies[c], direct.latencies[c], strict=True)
        ]
        lines.append(
            f"| {c} | {d50:.2f} | {d99:.2f} | {b50:.2f} | {b99:.2f} | {b50 - d50:+.2f} "
            f"({min(added):+.2f} to {max(added):+.2f}) "
            f"| {statistics.median(direct.rates[c]):,.0f} "
            f"| {statistics.median(ballast.rates[c]):,.0f} | {statistics.median(ratios):.3f} "
            f"| {cpu:.2f} | {served[0]:.2f} / {served[1]:.2f} | {verdict} (<= {GOAL_MS:g} ms) |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls a cell (default 1000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds at most (default 4)")
    parser.add_argument("--warmup", type=int, default=100, help="calls a client first")
    parser.add_argument("--concurrency", default="1,8", help="workers, comma separated")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=75.0,
        help="no new round starts after this many seconds of measuring (default 75)",
    )
    parser.add_argument("--sse", action="store_true", help="the server answers SSE streams")
    parser.add_argument(
        "--profile", type=Path, help="run Ballast under cProfile, its stats written here"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    procs = ProcessGroup()
    with tempfile.TemporaryDirectory() as tmp, signals_as_interrupt():
        try:
            workdir = Path(tmp)
            tool_url, tool_pid = start_tool_server(procs, workdir, args.sse)
            url, pid = start_ballast(procs, workdir, tool_url, args.profile)
            direct = Side("direct", tool_url, "echo", tool_pid, {})
            auth = {"authorization": f"Bearer {tg.BENCH_MASTER}"}
            ballast = Side("ballast", url, f"{SERVER}__echo", pid, auth)
            load = os.getloadavg()[0]
            rounds = asyncio.run(measure([direct, ballast], tool_pid, args))
            print(report(direct, ballast, rounds, load, args))
            return 0
        finally:
            procs.stop_all()


if __name__ == "__main__":
    raise SystemExit(main())

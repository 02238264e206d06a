"""`ballast demo`: two simulated upstreams, the gateway, a mixed workload through the official
openai client, and faults injected on a schedule; a live table shows them being survived."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import socket
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import openai
import uvicorn
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ballast.app import BallastApp
from ballast.config import parse_settings
from ballast.sim.server import SimServer, start_sim

# (seconds into the run, deployment, behaviour, what the audience should see)
SCHEDULE = [
    (0.0, "a", "ok?tokens=24&delay=0.01", "all healthy"),
    (0.2, "b", "ok?tokens=24&delay=0.01", ""),
    (5.0, "a", "500", "deployment a fails every request: failover, then its breaker opens"),
    (12.0, "a", "ok?tokens=24&delay=0.01", "a recovers: one probe, then traffic returns"),
    (16.0, "b", "429?retry_after=3", "b answers 429 Retry-After 3: cooled down, traffic to a"),
    (21.0, "b", "ok?tokens=24&delay=0.01", "b is back"),
    (24.0, "a", "stall?after=8&seconds=60", "a stalls mid-answer: streams continue on b"),
    (29.0, "a", "cut?after=12", "a cuts streams mid-answer: continued on b"),
    (34.0, "a", "ok?tokens=24&delay=0.01", "all healthy again"),
]
EXPECTED = "".join(f"tok{i} " for i in range(24))


@dataclass
class Tally:
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    incomplete: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    phase: str = "starting"


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.0f} ms"


async def _serve(app: BallastApp) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, http="httptools", log_level="error", access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no event)
        await asyncio.sleep(0.01)
    return server, task, port


async def _worker(client: openai.AsyncOpenAI, tally: Tally, stop: float, n: int) -> None:
    streaming = n % 2 == 0
    while time.monotonic() < stop:
        started = time.monotonic()
        try:
            if streaming:
                stream = await client.chat.completions.create(
                    model="demo-chat", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                text, first = "", None
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.monotonic() - started
                        text += chunk.choices[0].delta.content
                if first is not None:
                    tally.ttfts.append(first)
            else:
                reply = await client.chat.completions.create(
                    model="demo-chat", messages=[{"role": "user", "content": "hi"}]
                )
                text = reply.choices[0].message.content or ""
            if text == EXPECTED:
                tally.ok += 1
            else:
                tally.incomplete += 1
            tally.latencies.append(time.monotonic() - started)
        except openai.APIError as exc:
            tally.errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            await asyncio.sleep(0.05)


def _render(tally: Tally, app: BallastApp, stats: dict[str, Counter[str]], left: float) -> Group:
    summary = Table(title=f"Ballast demo — {tally.phase} ({left:.0f}s left)", expand=False)
    for column in (
        "complete answers",
        "client-visible errors",
        "incomplete",
        "p50",
        "p99",
        "TTFT p50",
        "TTFT p99",
    ):
        summary.add_column(column, justify="right")
    summary.add_row(
        str(tally.ok),
        str(sum(tally.errors.values())),
        str(tally.incomplete),
        _pct(tally.latencies, 0.5),
        _pct(tally.latencies, 0.99),
        _pct(tally.ttfts, 0.5),
        _pct(tally.ttfts, 0.99),
    )
    deployments = Table(title="Deployments", expand=False)
    for column in ("deployment", "breaker", "upstream attempts", "by outcome"):
        deployments.add_column(column)
    for dep_id, target in app.router.targets.items():
        outcomes = stats.get(dep_id, Counter())
        deployments.add_row(
            dep_id,
            target.breaker.state.value,
            str(sum(outcomes.values())),
            ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
        )
    events = Table(title="What the gateway did", expand=False)
    events.add_column("event")
    events.add_column("count", justify="right")
    for name, count in sorted(tally.events.items()):
        events.add_row(name, str(count))
    return Group(summary, deployments, events)


async def _stats(
    session: aiohttp.ClientSession, sims: dict[str, SimServer]
) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for dep_id, sim in sims.items():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(sim.url + "/sim/log") as response:
                data = await response.json()
            out[dep_id] = Counter(a["outcome"] for a in data["attempts"])
    return out


async def run_demo(
    seconds: float = 40.0, console: Console | None = None, dashboard_token: str | None = None
) -> int:
    console = console or Console()
    # The demo has no master key; a fresh read-only token opens its dashboard.
    token = dashboard_token or secrets.token_urlsafe(16)
    workdir = Path(tempfile.mkdtemp(prefix="ballast-demo-"))
    healthy = SCHEDULE[0][2]
    sims = {
        "a": await start_sim(default=healthy, name="a"),
        "b": await start_sim(default=healthy, name="b"),
    }
    settings = parse_settings(
        {
            "server": {"dashboard_token": token},
            "state": {  # the embedded default, in a throwaway directory
                "database_url": f"sqlite:///{workdir / 'demo.db'}",
                "spend_journal": str(workdir / "spend.journal"),
            },
            "timeouts": {"first_token": 1.0, "inter_chunk": 0.5, "answer": 1.5},
            "routing": {
                "breaker": {"failure_threshold": 3, "open_time": 1.0, "max_open_time": 3.0}
            },
            "models": [
                {
                    "name": "demo-chat",
                    "deployments": [
                        {
                            "id": dep,
                            "url": sim.url + "/v1",
                            "api_key": f"sk-demo-{dep}",
                            "supports_prefill": True,
                        }
                        for dep, sim in sims.items()
                    ],
                }
            ],
        }
    )
    app = BallastApp(settings)
    tally = Tally()
    app.observer.listeners.append(lambda name, fields: tally.events.update([name]))
    server, task, port = await _serve(app)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="sk-demo-client",
        max_retries=0,
        timeout=30,
    )
    console.print(
        f"Gateway on http://127.0.0.1:{port}/v1, upstreams a={sims['a'].url} "
        f"b={sims['b'].url}. Running {seconds:.0f}s of mixed traffic with faults."
    )
    console.print(
        f"Live dashboard: http://127.0.0.1:{port}/dashboard?token={token}", soft_wrap=True
    )
    began = time.monotonic()
    stop = began + seconds
    scale = seconds / 40.0
    session = aiohttp.ClientSession()
    workers = [asyncio.create_task(_worker(client, tally, stop, n)) for n in range(8)]
    stats: dict[str, Counter[str]] = {}
    pending = list(SCHEDULE)
    try:
        with Live(console=console, refresh_per_second=4) as live:
            while time.monotonic() < stop:
                elapsed = time.monotonic() - began
                while pending and pending[0][0] * scale <= elapsed:
                    _, dep, behaviour, note = pending.pop(0)
                    async with session.put(
                        sims[dep].url + "/sim/behaviour",
                        json={"model": "*", "behaviour": behaviour},
                    ):
                        pass
                    if note:
                        tally.phase = note
                stats = await _stats(session, sims)
                live.update(_render(tally, app, stats, stop - time.monotonic()))
                await asyncio.sleep(0.25)
            await asyncio.gather(*workers, return_exceptions=True)
            stats = await _stats(session, sims)
            tally.phase = "finished"
            live.update(_render(tally, app, stats, 0))
    finally:
        for worker in workers:
            worker.cancel()
        await session.close()
        await client.close()
        server.should_exit = True
        await task
        for sim in sims.values():
            await sim.close()
        shutil.rmtree(workdir, ignore_errors=True)
    total = tally.ok + tally.incomplete + sum(tally.errors.values())
    upstream_failures = sum(
        n for counter in stats.values() for k, n in counter.items() if k != "ok"
    )
    rate = 100.0 * tally.ok / total if total else 0.0
    console.print(
        f"\n{total} requests, {tally.ok} complete answers ({rate:.2f} %), "
        f"{sum(tally.errors.values())} client-visible errors, {tally.incomplete} incomplete; "
        f"the upstreams failed {upstream_failures} times underneath. "
        f"p50 {_pct(tally.latencies, 0.5)}, p99 {_pct(tally.latencies, 0.99)}, "
        f"median TTFT {statistics.median(tally.ttfts) * 1000 if tally.ttfts else 0:.0f} ms."
    )
    return 0 if total and rate >= 99.0 else 1

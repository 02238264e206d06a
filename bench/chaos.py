"""Ballast reliability suite: every fault scenario, back to back, against real gateways and
simulators on loopback (all in this process), with a table of what the clients saw.

    .venv/bin/python bench/chaos.py              # every scenario, ~1 minute
    .venv/bin/python bench/chaos.py --short      # small counts (what CI runs)
    .venv/bin/python bench/chaos.py --soak 600   # then 10 minutes of mixed traffic and faults

The soak reports the process's resident memory, open file descriptors and asyncio tasks
before and after (flat is the goal). Exit status 1 when any verdict is FAIL."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn

from ballast.actor.server import start_actor
from ballast.api.admin import process_stats
from ballast.app import BallastApp
from ballast.config import parse_settings
from ballast.sim.server import SimServer, start_sim

FAST = {"connect": 1.0, "first_token": 0.5, "inter_chunk": 0.5, "answer": 1.5, "request": 20.0}
MESSAGES = [{"role": "user", "content": "hi"}]
TOKENS = 8
EXPECTED = "".join(f"tok{i} " for i in range(TOKENS))


@dataclass
class Row:
    scenario: str
    requests: int
    ok: int
    p99: float
    attempts: int
    verdict: str
    note: str = ""

    @property
    def success(self) -> float:
        return self.ok / self.requests if self.requests else 0.0


@dataclass
class Outcome:
    ok: bool
    status: int
    seconds: float


@dataclass
class Harness:
    count: int
    concurrency: int
    workdir: Path
    sims: list[SimServer] = field(default_factory=list)
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    async def sim(self, default: str, name: str = "sim") -> SimServer:
        server = await start_sim(default=default, name=name)
        self.sims.append(server)
        return server

    async def gateway(self, models: list[dict[str, Any]], **extra: Any) -> str:
        routing = extra.pop("routing", {})
        state = {
            "database_url": f"sqlite+aiosqlite:///{self.workdir / f'g{len(self.servers)}.db'}",
            "spend_journal": str(self.workdir / f"spend{len(self.servers)}.journal"),
            **extra.pop("state", {}),
        }
        settings = parse_settings(
            {"timeouts": FAST, "routing": routing, "state": state, "models": models, **extra},
            environ={},
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            BallastApp(settings),
            http="ballast.server.protocol:GuardedHttpToolsProtocol",
            lifespan="on",
            log_level="critical",
            access_log=False,
        )
        server = uvicorn.Server(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        self.servers.append((server, task))
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        for server, _ in self.servers:
            server.should_exit = True
        for _, task in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
        for sim in self.sims:
            await sim.close()
        self.servers.clear()
        self.sims.clear()

    async def one(
        self, url: str, model: str, stream: bool, headers: dict[str, str] | None = None
    ) -> Outcome:
        assert self.session is not None
        body = {"model": model, "messages": MESSAGES, "stream": stream}
        started = time.perf_counter()
        try:
            async with self.session.post(
                url + "/v1/chat/completions", json=body, headers=headers or {}
            ) as response:
                raw = await response.read()
                text = _text_of(raw, stream) if response.status == 200 else ""
                ok = response.status == 200 and text == EXPECTED
                return Outcome(ok, response.status, time.perf_counter() - started)
        except (aiohttp.ClientError, TimeoutError):
            return Outcome(False, 0, time.perf_counter() - started)

    async def load(
        self,
        url: str,
        model: str,
        *,
        stream: bool = False,
        count: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> list[Outcome]:
        total = self.count if count is None else count
        gate = asyncio.Semaphore(self.concurrency)

        async def each(i: int) -> Outcome:
            async with gate:
                return await self.one(url, model, stream or i % 2 == 1, headers)

        return list(await asyncio.gather(*(each(i) for i in range(total))))


def _text_of(raw: bytes, stream: bool) -> str:
    import orjson

    if not stream:
        return str(orjson.loads(raw)["choices"][0]["message"]["content"])
    text = ""
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            payload = orjson.loads(line[6:])
            if "error" in payload:
                return ""
            for choice in payload.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return text if raw.rstrip().endswith(b"data: [DONE]") else ""


def p99(outcomes: list[Outcome]) -> float:
    ordered = sorted(o.seconds for o in outcomes)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def attempts(*sims: SimServer) -> int:
    from ballast.sim.state import SIM_STATE

    return sum(int(sim.app[SIM_STATE].stats()["total"]) for sim in sims)


def ordered(name: str, *deployments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "deployments": list(deployments), "strategy": "ordered", **extra}


def dep(dep_id: str, sim: SimServer, **extra: Any) -> dict[str, Any]:
    return {"id": dep_id, "url": sim.url + "/v1", "model": "sim-chat", **extra}


def judge(
    name: str,
    outcomes: list[Outcome],
    tries: int,
    *,
    min_success: float = 1.0,
    max_p99: float = 5.0,
    note: str = "",
) -> Row:
    ok = sum(o.ok for o in outcomes)
    row = Row(name, len(outcomes), ok, p99(outcomes), tries, "PASS", note)
    if row.success < min_success or row.p99 > max_p99:
        row.verdict = "FAIL"
    return row


# -- the scenarios ------------------------------------------------------------------------

Scenario = Callable[[Harness], Awaitable[Row]]
OK = f"ok?tokens={TOKENS}&delay=0.005"


async def rate_limit_storm(h: Harness) -> Row:
    bad, good = await h.sim("429?retry_after=2"), await h.sim(OK)
    url = await h.gateway([ordered("chat", dep("a", bad), dep("b", good))])
    outcomes = await h.load(url, "chat")
    return judge(
        "429 storm + Retry-After",
        outcomes,
        attempts(bad, good),
        max_p99=1.0,
        note=f"{attempts(bad)} attempts on the 429ing deployment",
    )


async def hang(h: Harness) -> Row:
    bad, good = await h.sim("hang"), await h.sim(OK)
    url = await h.gateway([ordered("chat", dep("a", bad), dep("b", good))])
    outcomes = await h.load(url, "chat")
    return judge("hang", outcomes, attempts(bad, good), max_p99=2.5)


async def stall(h: Harness) -> Row:
    bad, good = await h.sim(f"stall?after=3&tokens={TOKENS}"), await h.sim(OK)
    url = await h.gateway([ordered("chat", dep("a", bad), dep("b", good))])
    outcomes = await h.load(url, "chat", stream=True)
    return judge("stall mid-stream", outcomes, attempts(bad, good), max_p99=2.5)


async def cut(h: Harness) -> Row:
    bad, good = await h.sim(f"cut?after=3&tokens={TOKENS}"), await h.sim(OK)
    url = await h.gateway([ordered("chat", dep("a", bad), dep("b", good))])
    outcomes = await h.load(url, "chat", stream=True)
    return judge("cut mid-stream", outcomes, attempts(bad, good), max_p99=1.0)


async def random_500s(h: Harness) -> Row:
    spec = f"500?mode=random&p=0.3&tokens={TOKENS}&delay=0.005"
    a, b = await h.sim(spec), await h.sim(spec)
    url = await h.gateway([{"name": "chat", "deployments": [dep("a", a), dep("b", b)]}])
    # A success rate is only meaningful over enough requests: at least 200, even in --short
    # (a fraction of a second), so one unlucky request in 24 cannot decide the verdict.
    outcomes = await h.load(url, "chat", count=max(h.count, 200))
    return judge("30% random 500s", outcomes, attempts(a, b), min_success=0.98, max_p99=1.5)


async def outage(h: Harness) -> Row:
    a, b = await h.sim("503"), await h.sim("503")
    url = await h.gateway(
        [{"name": "chat", "deployments": [dep("a", a), dep("b", b)]}],
        routing={"breaker": {"failure_threshold": 3, "open_time": 30}},
    )
    await h.load(url, "chat", count=20)  # opens the breakers
    before = attempts(a, b)
    outcomes = await h.load(url, "chat")
    fast = [o for o in outcomes if o.status == 503]
    row = judge(
        "full outage (fast 503s)", outcomes, attempts(a, b) - before, min_success=0.0, max_p99=0.1
    )
    row.note = f"{len(fast)}/{len(outcomes)} answered 503"
    if len(fast) != len(outcomes) or row.attempts > len(outcomes) // 10:
        row.verdict = "FAIL"
    return row


async def recovery(h: Harness) -> Row:
    from ballast.sim.state import SIM_STATE

    a = await h.sim("503")
    url = await h.gateway(
        [{"name": "chat", "deployments": [dep("a", a)]}],
        routing={"breaker": {"failure_threshold": 3, "open_time": 0.5}},
    )
    await h.load(url, "chat", count=10)
    a.app[SIM_STATE].set_rule("*", OK)
    fixed = time.perf_counter()
    # The first success after the fix: open_time, then one probe lets traffic back.
    for _ in range(200):
        if (await h.one(url, "chat", False)).ok:
            break
        await asyncio.sleep(0.05)
    back = time.perf_counter() - fixed
    outcomes = await h.load(url, "chat")
    row = judge(
        "recovery",
        outcomes,
        attempts(a),
        max_p99=1.0,
        note=f"served again {back:.2f}s after the fix (open_time 0.5s)",
    )
    if back > 2.0:
        row.verdict = "FAIL"
    return row


async def context_fallback(h: Harness) -> Row:
    small, big = await h.sim("context_length"), await h.sim(OK)
    url = await h.gateway(
        [
            ordered("chat", dep("a", small), context_fallbacks=["big"]),
            ordered("big", dep("b", big)),
        ]
    )
    outcomes = await h.load(url, "chat")
    return judge("context-length fallback", outcomes, attempts(small, big), max_p99=1.0)


async def actor_reclaim(h: Harness) -> Row:
    backend = await h.sim(OK)
    actor = await start_actor(
        backend.url,
        idle_timeout=0.3,
        control_secret="chaos-control",
        jwt_secret="chaos-jwt-secret-0123456789abcdef",
        sweep_interval=0.05,
        shutdown_timeout=0.2,
    )
    try:
        url = await h.gateway(
            [
                {
                    "name": "chat",
                    "deployments": [
                        {
                            "id": "actor",
                            "url": actor.url,
                            "api_key": "chaos-control",
                            "provider": "actor",
                        }
                    ],
                }
            ]
        )
        outcomes = await h.load(url, "chat", count=max(4, h.count // 4))
        await asyncio.sleep(0.6)  # every run is reclaimed while idle
        outcomes += await h.load(url, "chat", count=max(4, h.count // 4))
        created = actor.registry.stats()["created"]
    finally:
        await actor.close()
    row = judge(
        "actor idle reclaim",
        outcomes,
        attempts(backend),
        max_p99=2.0,
        note=f"{created} runs created",
    )
    if created > 3:  # one run, then one more after the reclaim (single-flight)
        row.verdict = "FAIL"
    return row


async def _blackhole() -> tuple[asyncio.Server, int, list[asyncio.StreamWriter]]:
    """Accepts connections and never answers (a Redis that went silent)."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], held


async def redis_blackhole(h: Harness) -> Row:
    server, port, held = await _blackhole()
    try:
        sim = await h.sim(OK)
        url = await h.gateway(
            [{"name": "chat", "deployments": [dep("a", sim)]}],
            server={"master_key": "sk-chaos-master-key-0123"},
            state={"redis_url": f"redis://127.0.0.1:{port}/0", "redis_timeout": 0.05},
        )
        assert h.session is not None
        async with h.session.post(
            url + "/admin/keys",
            json={"name": "chaos", "rpm": 100000, "tpm": 10**8},
            headers={"authorization": "Bearer sk-chaos-master-key-0123"},
        ) as response:
            key = (await response.json())["key"]
        outcomes = await h.load(url, "chat", headers={"authorization": f"Bearer {key}"})
    finally:
        server.close()
        for writer in held:
            writer.close()
    return judge(
        "Redis blackhole",
        outcomes,
        attempts(sim),
        max_p99=1.0,
        note="keys, limits and spend on their local fallbacks",
    )


SCENARIOS: list[Scenario] = [
    rate_limit_storm,
    hang,
    stall,
    cut,
    random_500s,
    outage,
    recovery,
    context_fallback,
    actor_reclaim,
    redis_blackhole,
]


# -- soak -----------------------------------------------------------------------------------


@dataclass
class Footprint:
    rss_mb: float
    fds: int
    tasks: int

    @staticmethod
    def now() -> Footprint:
        gc.collect()
        stats = process_stats()
        return Footprint(stats.get("rss_bytes", 0) / 1e6, stats.get("open_fds", 0), stats["tasks"])


async def soak(h: Harness, seconds: float) -> tuple[Row, Footprint, Footprint]:
    from ballast.sim.state import SIM_STATE

    a, b, c = await h.sim(OK), await h.sim(OK), await h.sim(OK)
    url = await h.gateway(
        [{"name": "chat", "deployments": [dep("a", a), dep("b", b), dep("c", c)]}]
    )
    faults = [
        OK,
        f"500?mode=random&p=0.3&tokens={TOKENS}",
        "429?retry_after=1",
        f"stall?after=3&tokens={TOKENS}",
        f"cut?after=3&tokens={TOKENS}",
        "hang",
        "reset",
    ]
    rng = random.Random(7)
    outcomes: list[Outcome] = []

    async def traffic(until: float) -> None:
        while time.monotonic() < until:
            outcomes.extend(await h.load(url, "chat", count=h.concurrency))

    await traffic(time.monotonic() + min(5.0, seconds / 4))  # warm up: pools, caches, imports
    outcomes.clear()
    await asyncio.sleep(1.0)
    before = Footprint.now()
    end = time.monotonic() + seconds
    runner = asyncio.create_task(traffic(end))
    upstream = 0
    while time.monotonic() < end:
        # One faulty deployment at a time, changed every 3 s; the others stay healthy.
        victim = rng.choice([a, b, c])
        for sim in (a, b, c):
            sim.app[SIM_STATE].set_rule("*", rng.choice(faults) if sim is victim else OK)
        await asyncio.sleep(min(3.0, max(0.0, end - time.monotonic())))
        # The simulators' attempt logs live in this process too: count and drop them, so
        # the footprint below is the gateway's and not the logs'.
        upstream += attempts(a, b, c)
        for sim in (a, b, c):
            sim.app[SIM_STATE].clear_log()
    await runner
    upstream += attempts(a, b, c)
    for sim in (a, b, c):
        sim.app[SIM_STATE].set_rule("*", OK)
    await asyncio.sleep(2.0)  # let timers and pooled connections settle
    after = Footprint.now()
    row = judge(f"soak {seconds:.0f}s (mixed)", outcomes, upstream, min_success=0.99, max_p99=3.0)
    return row, before, after


# -- running --------------------------------------------------------------------------------


def render(rows: list[Row]) -> str:
    head = f"{'scenario':28} {'requests':>8} {'success':>8} {'p99':>8} {'attempts':>9}  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.scenario:28} {r.requests:>8} {r.success:>8.1%} {r.p99 * 1000:>6.0f}ms "
            f"{r.attempts:>9}  {r.verdict}" + (f"  ({r.note})" if r.note else "")
        )
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def harness(count: int, concurrency: int) -> AsyncIterator[Harness]:
    workdir = Path(tempfile.mkdtemp(prefix="ballast-chaos-"))
    h = Harness(count, concurrency, workdir)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        h.session = session
        try:
            yield h
        finally:
            await h.close()
            shutil.rmtree(workdir, ignore_errors=True)


def redis_available() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return True


async def run(
    short: bool, soak_seconds: float | None, only: list[str] | None = None
) -> tuple[list[Row], tuple[Footprint, Footprint] | None]:
    count, concurrency = (24, 8) if short else (200, 16)
    rows: list[Row] = []
    for scenario in SCENARIOS:
        if only and scenario.__name__ not in only:
            continue
        if scenario is redis_blackhole and not redis_available():
            continue
        async with harness(count, concurrency) as h:
            started = time.perf_counter()
            row = await scenario(h)
            row.note = (
                row.note + "; " if row.note else ""
            ) + f"{time.perf_counter() - started:.1f}s"
            rows.append(row)
            print(render([row]).splitlines()[-1], file=sys.stderr, flush=True)
    footprint = None
    if soak_seconds:
        async with harness(count, concurrency) as h:
            row, before, after = await soak(h, soak_seconds)
            rows.append(row)
            footprint = (before, after)
    return rows, footprint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ballast reliability suite")
    parser.add_argument("--short", action="store_true", help="small counts (CI)")
    parser.add_argument("--soak", type=float, metavar="SECONDS", help="add a soak this long")
    parser.add_argument("--only", help="comma-separated scenario function names")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    only = args.only.split(",") if args.only else None
    rows, footprint = asyncio.run(run(args.short, args.soak, only))
    print(render(rows))
    if footprint is not None:
        before, after = footprint
        print(
            f"\nsoak footprint  before: rss {before.rss_mb:.1f} MB, {before.fds} fds, "
            f"{before.tasks} tasks\n                after:  rss {after.rss_mb:.1f} MB, "
            f"{after.fds} fds, {after.tasks} tasks\n                growth: rss "
            f"{after.rss_mb - before.rss_mb:+.1f} MB, fds {after.fds - before.fds:+d}, "
            f"tasks {after.tasks - before.tasks:+d}"
        )
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

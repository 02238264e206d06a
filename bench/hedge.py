"""TTFT with and without hedging against heavy-tailed upstreams, measured in one run.

Two simulated deployments answer their first token at once, except 10 % of the time when
it takes 0.5 s more. The same streaming load runs through Ballast with hedging off and on
(hedge after 50 ms) and the table shows TTFT p50/p99 and the upstream attempts per request.

    .venv/bin/python bench/hedge.py [--requests 400] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

import aiohttp
import uvicorn

from ballast.app import BallastApp
from ballast.config import parse_settings
from ballast.sim.server import SimServer, start_sim

SPEC = "ok?tokens=8&tail_p=0.1&tail_delay=0.5"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def serve(app: BallastApp) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no event)
        await asyncio.sleep(0.01)
    return server, task, port


async def attempts(session: aiohttp.ClientSession, sims: list[SimServer]) -> int:
    total = 0
    for sim in sims:
        async with session.get(sim.url + "/sim/log") as response:
            total += len((await response.json())["attempts"])
        async with session.delete(sim.url + "/sim/log"):
            pass
    return total


async def measure(
    hedge_after: float | None, sims: list[SimServer], n: int, conc: int
) -> dict[str, float]:
    routing = {"hedge_after": hedge_after} if hedge_after else {}
    settings = parse_settings(
        {
            "routing": routing,
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {"id": f"d{i}", "url": sim.url + "/v1"} for i, sim in enumerate(sims)
                    ],
                }
            ],
        }
    )
    app = BallastApp(settings)
    server, task, port = await serve(app)
    ttfts: list[float] = []
    remaining = n
    async with aiohttp.ClientSession() as session:
        await attempts(session, sims)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.monotonic()
                async with session.post(url, json=BODY) as response:
                    first = None
                    async for chunk in response.content.iter_any():
                        if first is None and b'"content":"tok' in chunk:
                            first = time.monotonic() - started
                    ttfts.append(first if first is not None else float("nan"))

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(conc))), 120)
        upstream = await attempts(session, sims)
    server.should_exit = True
    await task
    ttfts.sort()
    return {
        "p50": ttfts[len(ttfts) // 2] * 1000,
        "p99": ttfts[int(len(ttfts) * 0.99)] * 1000,
        "attempts": upstream / n,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    sims = [await start_sim(default=SPEC, name=f"tail{i}") for i in range(2)]
    try:
        off = await measure(None, sims, args.requests, args.concurrency)
        on = await measure(0.05, sims, args.requests, args.concurrency)
    finally:
        for sim in sims:
            await sim.close()
    print(f"upstreams: 2 x '{SPEC}', {args.requests} streams at {args.concurrency} concurrent")
    print("| hedging | TTFT p50 ms | TTFT p99 ms | upstream attempts / request |")
    print("|---|---|---|---|")
    for name, row in (("off", off), ("after 50 ms", on)):
        print(f"| {name} | {row['p50']:.1f} | {row['p99']:.1f} | {row['attempts']:.2f} |")
    print(f"TTFT p99 gain: {off['p99'] / on['p99']:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())

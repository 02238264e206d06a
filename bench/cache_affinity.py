"""The share of prompt tokens read from the provider's cache, with prompt-cache affinity on
and off, measured in one run.

Two simulated deployments, each with its own OpenAI-style prompt cache (a prompt's longest
run of leading messages seen before, from 1,024 tokens, in steps of 128). Conversations of
several turns, each turn sending the whole conversation so far, run concurrently through
Ballast against one model group of the two, with `affinity: prompt_cache` and then
`affinity: off` (the default health routing alone); half the conversations name
themselves with `prompt_cache_key`, half are told by their prompt. The table shows the
share of prompt tokens the deployments read from their caches, and how many conversations
moved between deployments.

    .venv/bin/python bench/cache_affinity.py [--conversations 24] [--turns 6] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

import aiohttp
import uvicorn

from ballast.app import BallastApp
from ballast.config import parse_settings
from ballast.sim.server import SimServer, start_sim

SPEC = "ok?tokens=20&latency=0.02"


async def serve(app: BallastApp) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no event)
        await asyncio.sleep(0.01)
    return server, task, port


async def conversation(
    session: aiohttp.ClientSession,
    url: str,
    number: int,
    turns: int,
    mode: str,
    gate: asyncio.Semaphore,
) -> tuple[int, int, set[str]]:
    """(prompt tokens, cached tokens, the simulators that answered) of one conversation."""
    system = f"{mode} conversation {number}: " + "rule " * 1100
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    prompt = cached = 0
    served: set[str] = set()
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn} " + "word " * 200})
        body: dict[str, Any] = {"model": "m", "messages": messages}
        if number % 2 == 0:
            body["prompt_cache_key"] = f"{mode}-{number}"
        async with gate, session.post(url, json=body) as response:
            answer = await response.json()
        usage = answer["usage"]
        prompt += usage["prompt_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        served.add(answer["system_fingerprint"])
        messages.append(answer["choices"][0]["message"])
    return prompt, cached, served


async def measure(mode: str, sims: list[SimServer], args: argparse.Namespace) -> dict[str, float]:
    settings = parse_settings(
        {
            "models": [
                {
                    "name": "m",
                    "affinity": mode,
                    "deployments": [
                        {"id": f"d{i}", "url": sim.url + "/v1"} for i, sim in enumerate(sims)
                    ],
                }
            ]
        }
    )
    app = BallastApp(settings)
    server, task, port = await serve(app)
    gate = asyncio.Semaphore(args.concurrency)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        conversation(session, url, n, args.turns, mode, gate)
                        for n in range(args.conversations)
                    )
                ),
                120,
            )
    finally:
        server.should_exit = True
        await task
    prompt = sum(r[0] for r in results)
    return {
        "share": sum(r[1] for r in results) / prompt,
        "moved": sum(len(r[2]) > 1 for r in results),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    sims = [await start_sim(default=SPEC, name=f"cache{i}") for i in range(2)]
    try:
        rows = {mode: await measure(mode, sims, args) for mode in ("prompt_cache", "off")}
    finally:
        for sim in sims:
            await sim.close()
    print(
        f"upstreams: 2 x '{SPEC}'; {args.conversations} conversations of {args.turns} turns,"
        f" {args.concurrency} requests at a time"
    )
    print("| affinity | prompt tokens read from the cache | conversations that moved |")
    print("|---|---|---|")
    for mode, row in rows.items():
        print(f"| {mode} | {row['share']:.1%} | {row['moved']:.0f} of {args.conversations} |")


if __name__ == "__main__":
    asyncio.run(main())

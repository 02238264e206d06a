"""CPU per request of Ballast's ASGI app called directly (no HTTP server in between) against
the fixed-answer nginx upstream: the steadiest figure for comparing two versions of the hot
path on a busy machine. The process's CPU time (all its threads) over a fixed number of
requests, in several phases; the lowest phase is the least disturbed one. The event loop's
thread alone is given too: one worker's throughput is bound by it, while the database
driver's thread can use another core. So is the wall-clock time per request: CPU time does
not count the time the loop waits for the interpreter lock while another thread holds it,
which only the wall clock shows (8 requests are always in flight, so the loop is never idle
for want of work).

    .venv/bin/python bench/cpu.py                      # non-streaming, this tree's src/
    .venv/bin/python bench/cpu.py --stream
    .venv/bin/python bench/cpu.py --stream --shape messages-native  # Messages passed through
    .venv/bin/python bench/cpu.py --stream --shape messages    # Messages bridged to chat
    .venv/bin/python bench/cpu.py --stream --shape responses   # Responses bridged to chat
    .venv/bin/python bench/cpu.py --src ../old/src     # an older tree, for an A/B
    .venv/bin/python bench/cpu.py --keys               # with a key, limits, budget, spend
    .venv/bin/python bench/cpu.py --keys --redis redis://127.0.0.1:6379/0

Not part of the test suite. Run an A/B interleaved (old, new, old, new): the machine's other
work moves the absolute numbers by more than most single changes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import targets as tg
from procs import ProcessGroup

CONCURRENCY = 8
# Per API shape asked: its path, and whether its deployments are Anthropic's (native).
SHAPES = {
    "chat": (b"/v1/chat/completions", False),
    "messages": (b"/v1/messages", False),
    "messages-native": (b"/v1/messages", True),
    "responses": (b"/v1/responses", False),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="streamed chat completions")
    parser.add_argument("--src", type=Path, default=tg.REPO / "src", help="Ballast's src/")
    parser.add_argument("--keys", action="store_true", help="keys, limits, budget and spend")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="chat",
        help="the API asked: chat; Anthropic Messages bridged to the chat upstream or passed"
        " through to a Messages upstream (messages-native); Responses bridged to chat",
    )
    parser.add_argument(
        "--redis", metavar="URL", help="with --keys: keep limits and spend in Redis"
    )
    parser.add_argument("--requests", type=int, default=8000, help="per phase")
    parser.add_argument("--phases", type=int, default=6)
    return parser.parse_args()


def scope(body: bytes, key: str, shape: str) -> dict[str, Any]:
    path = SHAPES[shape][0]
    messages = path == b"/v1/messages"
    auth = (
        (b"x-api-key", key.encode()) if messages else (b"authorization", b"Bearer " + key.encode())
    )
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), auth]
    if messages:
        headers.append((b"anthropic-version", b"2023-06-01"))
    headers.append((b"content-length", str(len(body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": path.decode(),
        "raw_path": path,
        "query_string": b"",
        "headers": headers,
    }


def request_body(model: str, stream: bool, shape: str) -> bytes:
    """One short question in the shape's own request."""
    request: dict[str, Any] = {"model": model, "stream": stream}
    if shape == "responses":
        request["input"] = "hi"
    else:
        request["messages"] = [{"role": "user", "content": "hi"}]
    if shape.startswith("messages"):
        request["max_tokens"] = 256
    return json.dumps(request).encode()


async def measure(
    args: argparse.Namespace, config: dict[str, Any], key: str
) -> list[tuple[float, float, float]]:
    from ballast.app import BallastApp
    from ballast.config import Settings
    from ballast.observe.logs import setup_logging

    setup_logging("warning")
    app = BallastApp(Settings.model_validate(config))
    await app.startup()
    # As `ballast serve` does once started; the module was heap.py in older trees, and trees
    # older still have none.
    for module in ("ballast.gc_tuning", "ballast.heap"):
        try:
            tuning = importlib.import_module(module)
        except ImportError:
            continue
        tuning.settle_after_startup(app.settings.server.gc_young_threshold)
        break
    model = "bench-stream" if args.stream else "bench-model"
    body = request_body(model, args.stream, args.shape)
    failures = 0

    async def one() -> None:
        nonlocal failures
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # the client never goes away
            return {"type": "http.disconnect"}

        status = 0

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope(body, key, args.shape), receive, send)
        failures += status != 200

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    try:
        await asyncio.gather(*(worker(200) for _ in range(CONCURRENCY)))  # warm up
        phases = []
        for _ in range(args.phases):
            started, loop_started = time.process_time(), time.thread_time()
            wall_started = time.perf_counter()
            await asyncio.gather(
                *(worker(args.requests // CONCURRENCY) for _ in range(CONCURRENCY))
            )
            whole = (time.process_time() - started) * 1e6 / args.requests
            loop_thread = (time.thread_time() - loop_started) * 1e6 / args.requests
            wall = (time.perf_counter() - wall_started) * 1e6 / args.requests
            phases.append((whole, loop_thread, wall))
    finally:
        await app.shutdown()
    if failures:
        raise SystemExit(f"{failures} requests did not answer 200")
    return phases


def describe(args: argparse.Namespace) -> str:
    shape = "" if args.shape == "chat" else f", {args.shape}"
    if not args.keys:
        return "open" + shape
    return "keys+limits+spend" + (", Redis" if args.redis else ", SQLite") + shape


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(args.src.resolve()))  # ahead of any installed copy
    import uvloop

    procs = ProcessGroup()
    workdir = Path(tempfile.mkdtemp(prefix="ballast-cpu-"))
    os.chdir(workdir)  # the embedded database and journal land here
    try:
        upstream = tg.start_nginx(procs, workdir)
        key = "sk-bench"
        extra = None
        if args.keys:
            extra = tg.keys_config(workdir, "cpu", args.redis)
            key = tg.create_key(workdir, upstream, extra, args.src.resolve())
        config = tg.ballast_config(0, upstream, extra, anthropic=SHAPES[args.shape][1])
        phases = uvloop.run(measure(args, config, key))
    finally:
        procs.stop_all()
        os.chdir("/")
        shutil.rmtree(workdir, ignore_errors=True)
    kind = "stream" if args.stream else "request"
    whole = [p[0] for p in phases]
    loop_thread = [p[1] for p in phases]
    wall = [p[2] for p in phases]
    print(
        f"CPU per {kind}: min {min(whole):.1f} us, median {statistics.median(whole):.1f} us; "
        f"event loop's thread alone: min {min(loop_thread):.1f}, median "
        f"{statistics.median(loop_thread):.1f}; wall clock: min {min(wall):.1f}, median "
        f"{statistics.median(wall):.1f} ({args.phases} phases of {args.requests}, "
        f"{CONCURRENCY} concurrent, {describe(args)}, src {args.src})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

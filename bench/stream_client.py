"""Streaming load: N concurrent chat streams for a bounded time, measuring time to first
chunk (TTFC) and total time per stream.

``python bench/stream_client.py URL --concurrency 8 --duration 3`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import aiohttp

BODY = json.dumps(
    {
        "model": "bench-stream",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
).encode()
MESSAGES_BODY = json.dumps(
    {
        "model": "bench-stream",
        "stream": True,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "hi"}],
    }
).encode()
# The same stream asked for on the Responses API.
RESPONSES_BODY = json.dumps({"model": "bench-stream", "stream": True, "input": "hi"}).encode()
# Per inbound API shape: the body, and what the end of a whole stream holds.
SHAPES = {
    "openai": (BODY, b"[DONE]"),
    "messages": (MESSAGES_BODY, b'"message_stop"'),
    "responses": (RESPONSES_BODY, b"response.completed"),
}


def headers_for(key: str, shape: str = "openai") -> dict[str, str]:
    if shape == "messages":
        return {"Content-Type": "application/json", "x-api-key": key}
    return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}


@dataclass
class StreamResult:
    streams: int
    errors: int
    seconds: float
    ttfc_p50_ms: float
    ttfc_p99_ms: float
    total_p50_ms: float
    total_p99_ms: float
    first_error: str

    @property
    def streams_per_s(self) -> float:
        return self.streams / self.seconds if self.seconds else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def _worker(
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    url: str,
    shape: str,
    deadline: float,
    budget: list[int],
    ttfc: list[float],
    total: list[float],
    errors: list[str],
) -> None:
    body, end = SHAPES[shape]
    while time.perf_counter() < deadline and budget[0] > 0:
        budget[0] -= 1
        start = time.perf_counter()
        first = 0.0
        tail = b""
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    errors.append(f"HTTP {resp.status}")
                    await resp.read()
                    continue
                async for chunk in resp.content.iter_any():
                    if not first and chunk:
                        first = time.perf_counter()
                    tail = (tail + chunk)[-4096:]  # the end marker is in the last event
        except (aiohttp.ClientError, TimeoutError) as exc:
            errors.append(repr(exc))
            continue
        if end not in tail:
            errors.append(f"stream ended without {end.decode()}")
            continue
        ttfc.append(first - start)
        total.append(time.perf_counter() - start)


async def run(
    url: str,
    concurrency: int,
    duration: float,
    max_streams: int = 1_000_000,
    key: str = "sk-bench",
    shape: str = "openai",
    extra: dict[str, str] | None = None,
) -> StreamResult:
    """Keep ``concurrency`` streams of API ``shape`` in flight for ``duration`` s (or
    ``max_streams``), with the ``extra`` headers."""
    headers = {**headers_for(key, shape), **(extra or {})}
    ttfc: list[float] = []
    total: list[float] = []
    errors: list[str] = []
    budget = [max_streams]
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=300)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        deadline = start + duration
        workers = [
            _worker(session, headers, url, shape, deadline, budget, ttfc, total, errors)
            for _ in range(concurrency)
        ]
        await asyncio.wait_for(asyncio.gather(*workers), timeout=duration + 60)
        elapsed = time.perf_counter() - start
    return StreamResult(
        streams=len(total),
        errors=len(errors),
        seconds=elapsed,
        ttfc_p50_ms=statistics.median(ttfc) * 1e3 if ttfc else float("nan"),
        ttfc_p99_ms=_pct(ttfc, 0.99),
        total_p50_ms=statistics.median(total) * 1e3 if total else float("nan"),
        total_p99_ms=_pct(total, 0.99),
        first_error=errors[0] if errors else "",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--max-streams", type=int, default=1_000_000)
    parser.add_argument("--key", default="sk-bench", help="API key sent as the bearer token")
    parser.add_argument("--shape", default="openai", choices=sorted(SHAPES))
    parser.add_argument("--header", action="append", default=[], help="'name: value', again")
    args = parser.parse_args()
    extra = dict(h.split(": ", 1) for h in args.header)
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(
            run(
                args.url,
                args.concurrency,
                args.duration,
                args.max_streams,
                args.key,
                args.shape,
                extra,
            )
        )
    print(json.dumps({**asdict(result), "streams_per_s": result.streams_per_s}))


if __name__ == "__main__":
    main()

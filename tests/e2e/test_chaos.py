"""The reliability suite's short run (`bench/chaos.py --short`): every fault scenario of the
earlier issues, back to back, each with its verdict."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_every_chaos_scenario_passes_its_verdict() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import chaos
    finally:
        sys.path.remove(str(BENCH))
    rows, _ = asyncio.run(chaos.run(short=True, soak_seconds=None))
    names = {row.scenario for row in rows}
    assert {
        "429 storm + Retry-After",
        "hang",
        "stall mid-stream",
        "cut mid-stream",
        "30% random 500s",
        "full outage (fast 503s)",
        "recovery",
        "context-length fallback",
        "actor idle reclaim",
    } <= names
    failed = [row for row in rows if row.verdict != "PASS"]
    assert not failed, chaos.render(rows)

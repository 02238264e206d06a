"""Time is a dependency (DESIGN.md, "How we test"): measured from the source, no module of the
gateway reads the wall or monotonic clock, or arms a timer on the event loop's own clock,
except through the injected `Clock`. A read that goes around it is a window a test's
ManualClock cannot move, so the test waits for real or cannot reach the case at all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "ballast"

# Where reading the real clock is the point, and why.
EXEMPT = {
    "resilience/clock.py": "the clock itself: SystemClock is where the real time comes from",
    "demo.py": "a load generator measuring the real gateway from outside, as a client would",
    "server/accept.py": "part of the event loop (a server the loop creates), on its own timers",
}
EXEMPT_PACKAGES = {
    "sim": "the simulator is the independent upstream the gateway is measured against",
}

_TIME_FUNCS = frozenset(
    {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}
)
_DATE_FUNCS = frozenset({"now", "utcnow", "today"})
_ASYNCIO_TIMERS = frozenset({"sleep", "timeout", "timeout_at", "wait_for", "wait"})
_LOOP_TIMERS = frozenset({"time", "call_later", "call_at"})


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, 0.0, None)


def _asyncio_timer(call: ast.Call, name: str) -> bool:
    """Whether a call of asyncio's `name` waits on the loop's clock."""
    if name == "sleep":
        return bool(call.args) and not _is_zero(call.args[0])  # sleep(0) only yields
    if name == "wait_for":
        timeout = call.args[1] if len(call.args) > 1 else None
        timeout = timeout or next((k.value for k in call.keywords if k.arg == "timeout"), None)
        return timeout is not None and not _is_zero(timeout)
    if name == "wait":
        return any(k.arg == "timeout" and not _is_zero(k.value) for k in call.keywords)
    return True  # timeout, timeout_at


def clock_reads(source: str) -> list[str]:
    """Each place in `source` that reads time without the injected clock, as `line: code`."""
    tree = ast.parse(source)
    time_names: set[str] = set()  # what the time module is called here
    asyncio_names: set[str] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    time_names.add(alias.asname or "time")
                elif alias.name == "asyncio":
                    asyncio_names.add(alias.asname or "asyncio")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = {a.name for a in node.names}
            if (node.module == "time" and names & _TIME_FUNCS) or (
                node.module == "asyncio" and names & _ASYNCIO_TIMERS
            ):
                found.append((node.lineno, ast.unparse(node)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in time_names and node.attr in _TIME_FUNCS:
                found.append((node.lineno, ast.unparse(node)))
            elif node.attr in _DATE_FUNCS and ast.unparse(base).split(".")[-1] in (
                "datetime",
                "date",
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            base_text = ast.unparse(func.value)
            if (
                isinstance(func.value, ast.Name)
                and func.value.id in asyncio_names
                and func.attr in _ASYNCIO_TIMERS
                and _asyncio_timer(node, func.attr)
            ) or (func.attr in _LOOP_TIMERS and "loop" in base_text.lower()):
                found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {code}" for line, code in sorted(set(found))]


def _exempt(path: Path) -> bool:
    relative = path.relative_to(ROOT)
    return relative.as_posix() in EXEMPT or relative.parts[0] in EXEMPT_PACKAGES


def test_no_module_reads_the_clock_around_the_injected_one() -> None:
    offenders = {
        path.relative_to(ROOT).as_posix(): reads
        for path in sorted(ROOT.rglob("*.py"))
        if not _exempt(path) and (reads := clock_reads(path.read_text()))
    }
    assert offenders == {}, "take the clock as a dependency (resilience/clock.py's Clock)"


def test_every_exemption_is_still_needed() -> None:
    for relative in EXEMPT:
        assert clock_reads((ROOT / relative).read_text()), f"{relative} no longer reads time"


@pytest.mark.parametrize(
    "source",
    [
        "import time\nx = time.monotonic()",
        "import time as t\nx = t.time()",
        "from time import perf_counter",
        "import datetime\nx = datetime.datetime.now()",
        "from datetime import datetime\nx = datetime.now()",
        "from datetime import date\nx = date.today()",
        "x = loop.time()",
        "import asyncio\nx = asyncio.get_running_loop().time()",
        "x = self._loop.call_later(1.0, f)",
        "import asyncio\nasync def f():\n    await asyncio.sleep(1.0)",
        "import asyncio\nasync def f():\n    async with asyncio.timeout(5):\n        pass",
        "import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, 5)",
        "import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, timeout=5)",
        "import asyncio\nasync def f(ts):\n    await asyncio.wait(ts, timeout=5)",
        "from asyncio import sleep",
    ],
)
def test_a_read_around_the_clock_is_found(source: str) -> None:
    assert clock_reads(source)


@pytest.mark.parametrize(
    "source",
    [
        "x = clock.time() + self.clock.monotonic()",
        "async def f():\n    await self.clock.sleep(1.0)",
        "x = self._clock.call_later(1.0, f)",
        "import asyncio\nasync def f():\n    await asyncio.sleep(0)",
        "import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, None)",
        "import asyncio\nasync def f(ts):\n    await asyncio.wait(ts)",
        "x = self.timeout",
        "from datetime import UTC, datetime\nx = datetime.fromtimestamp(0, UTC)",
    ],
)
def test_the_injected_clock_is_not_a_read(source: str) -> None:
    assert clock_reads(source) == []

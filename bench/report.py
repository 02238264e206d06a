"""Aggregation (median of repetitions) and the markdown report with the issue's targets."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from load import WrkResult
from stream_client import StreamResult


@dataclass
class Cell:
    """Medians over the repetitions of one (target, connections) cell."""

    rps: float = math.nan
    p50: float = math.nan
    p90: float = math.nan
    p99: float = math.nan
    cpu_ms: float = math.nan
    errors: int = 0
    runs: int = 0


@dataclass
class StreamCell:
    streams_per_s: float = math.nan
    ttfc_p50: float = math.nan
    ttfc_p99: float = math.nan
    total_p50: float = math.nan
    errors: int = 0
    first_error: str = ""


@dataclass
class Results:
    connections: list[int]
    concurrencies: list[int]
    targets: list[str]
    wrk: dict[tuple[str, int], list[tuple[WrkResult, float]]] = field(default_factory=dict)
    streams: dict[tuple[str, int], list[StreamResult]] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # started, then broke mid-run
    notes: dict[str, str] = field(default_factory=dict)
    # (variant, baseline) -> the variant's req/s over its baseline's, one per adjacent pair
    pairs: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    # (variant, baseline, concurrency) -> the variant's streams/s over its baseline's
    stream_pairs: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    load_before: float = 0.0
    repetitions: int = 0  # completed; the time budget may stop a run short of the plan

    def cell(self, target: str, conns: int) -> Cell:
        runs = self.wrk.get((target, conns), [])
        if not runs:
            return Cell()

        def med(values: list[float]) -> float:
            return statistics.median(values)

        return Cell(
            rps=med([r.rps for r, _ in runs]),
            p50=med([r.p50_ms for r, _ in runs]),
            p90=med([r.p90_ms for r, _ in runs]),
            p99=med([r.p99_ms for r, _ in runs]),
            cpu_ms=med([cpu for _, cpu in runs]),
            errors=sum(r.errors for r, _ in runs),
            runs=len(runs),
        )

    def peak_rps(self, target: str) -> float:
        values = [self.cell(target, c).rps for c in self.connections]
        values = [v for v in values if not math.isnan(v)]
        return max(values) if values else math.nan

    def stream_cell(self, target: str, conc: int) -> StreamCell:
        runs = self.streams.get((target, conc), [])
        if not runs:
            return StreamCell()
        return StreamCell(
            streams_per_s=statistics.median([r.streams_per_s for r in runs]),
            ttfc_p50=statistics.median([r.ttfc_p50_ms for r in runs]),
            ttfc_p99=statistics.median([r.ttfc_p99_ms for r in runs]),
            total_p50=statistics.median([r.total_p50_ms for r in runs]),
            errors=sum(r.errors for r in runs),
            first_error=next((r.first_error for r in runs if r.first_error), ""),
        )


def _f(value: float, digits: int = 2) -> str:
    if math.isnan(value):
        return "–"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def _signed(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.2f}"


def main_table(res: Results) -> list[str]:
    head = (
        "| target | conns | req/s | p50 ms | p90 ms | p99 ms | +p50 vs direct ms | CPU ms/req "
        "| streams/s | TTFC p50 ms | TTFC p99 ms | +TTFC vs direct ms | peak RSS MB | errors |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for target in res.targets:
        if target in res.unavailable:
            reason = res.unavailable[target].replace("|", "/").replace("\n", " ")
            lines.append(f"| {target} | – | unavailable: {reason} |" + " |" * 11)
            continue
        for conns in res.connections:
            c = res.cell(target, conns)
            d = res.cell("direct", conns)
            s = res.stream_cell(target, conns)
            sd = res.stream_cell("direct", conns)
            has_stream = conns in res.concurrencies
            errors = c.errors + (s.errors if has_stream else 0)
            cols = [
                target,
                str(conns),
                _f(c.rps, 0),
                _f(c.p50),
                _f(c.p90),
                _f(c.p99),
                _signed(c.p50 - d.p50) if target != "direct" else "–",
                _f(c.cpu_ms, 3),
                _f(s.streams_per_s, 0) if has_stream else "",
                _f(s.ttfc_p50) if has_stream else "",
                _f(s.ttfc_p99) if has_stream else "",
                _signed(s.ttfc_p50 - sd.ttfc_p50) if has_stream and target != "direct" else "",
                _f(res.rss_mb.get(target, math.nan), 0),
                str(errors),
            ]
            lines.append("| " + " | ".join(cols) + " |")
    return lines


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


@dataclass
class Check:
    name: str
    goal: str
    measured: str
    ok: bool | None  # None: not measured in this run


def checks(res: Results, gateway: str = "ballast") -> list[Check]:
    """The issue's targets for ``gateway``, each against the same run's numbers."""
    out: list[Check] = []
    g32, b32 = res.cell(gateway, 32), res.cell("bare", 32)
    g1, b1 = res.cell(gateway, 1), res.cell("bare", 1)

    def add(name: str, goal: str, value: float, fmt: str, ok: bool) -> None:
        measured = "not measured" if math.isnan(value) else fmt.format(value)
        out.append(Check(name, goal, measured, None if math.isnan(value) else ok))

    r = _ratio(g32.rps, b32.rps)
    add("req/s @32: Ballast/bare", ">= 0.60", r, "{:.2f}", r >= 0.60)
    r = _ratio(g32.rps, res.cell("litellm", 32).rps)
    add("req/s @32: Ballast/LiteLLM", ">= 35x", r, "{:.1f}x", r >= 35)
    delta = g1.p50 - b1.p50
    add("added p50 @1 over bare's", "<= 0.10 ms", delta, "{:+.3f} ms", delta <= 0.10)
    r = _ratio(g32.p50, b32.p50)
    add("p50 @32: Ballast/bare", "<= 1.7x", r, "{:.2f}x", r <= 1.7)
    for conc in res.concurrencies:
        r = _ratio(
            res.stream_cell(gateway, conc).streams_per_s,
            res.stream_cell("bare", conc).streams_per_s,
        )
        add(f"streams/s @{conc}: Ballast/bare", ">= 0.60", r, "{:.2f}", r >= 0.60)
    if 8 in res.concurrencies:
        delta = res.stream_cell(gateway, 8).ttfc_p50 - res.stream_cell("bare", 8).ttfc_p50
        add("added TTFC p50 @8 over bare's", "<= 0.5 ms", delta, "{:+.3f} ms", delta <= 0.5)
    rss = res.rss_mb.get(gateway, math.nan)
    add("peak RSS per worker", "<= 80 MB", rss, "{:.0f} MB", rss <= 80)

    def add_ratio(name: str, goal: float, cells: float, variant: str, suffix: str) -> None:
        """A ratio target: the median of its adjacent pairs when measured, else the cells'."""
        add_paired(name, goal, cells, res.pairs.get((variant, gateway), []), suffix)

    def add_paired(name: str, goal: float, cells: float, pairs: list[float], suffix: str) -> None:
        if not pairs:
            add(name, f">= {goal:g}{suffix}", cells, "{:.2f}" + suffix, cells >= goal)
            return
        median = statistics.median(pairs)
        measured = (
            f"{median:.2f}{suffix} (median of {len(pairs)} pairs, "
            f"{min(pairs):.2f}-{max(pairs):.2f}; cells: {_f(cells)}{suffix})"
        )
        out.append(Check(name, f">= {goal:g}{suffix}", measured, median >= goal))

    r = _ratio(res.peak_rps("ballast-2w"), res.peak_rps(gateway))
    add_ratio("req/s: 2 workers @64 / 1 @32 (cells: peak at any conns)", 1.6, r, "ballast-2w", "x")
    r = _ratio(res.cell("ballast+keys", 32).rps, g32.rps)
    add_ratio("req/s @32: keys+limits+spend (SQLite) / plain", 0.75, r, "ballast+keys", "")
    r = _ratio(res.cell("ballast+keys+redis", 32).rps, g32.rps)
    add_ratio("req/s @32: keys+limits+spend (Redis) / plain", 0.75, r, "ballast+keys+redis", "")

    def add_stream_ratio(name: str, goal: float, variant: str) -> None:
        """A streamed ratio target at each concurrency, read as `add_ratio` reads one."""
        for conc in res.concurrencies:
            cells = _ratio(
                res.stream_cell(variant, conc).streams_per_s,
                res.stream_cell(gateway, conc).streams_per_s,
            )
            pairs = res.stream_pairs.get((variant, gateway, conc), [])
            add_paired(f"streams/s @{conc}: {name}", goal, cells, pairs, "")

    r = _ratio(res.cell("ballast-messages", 32).rps, g32.rps)
    add_ratio("req/s @32: Anthropic Messages / chat", 0.80, r, "ballast-messages", "")
    add_stream_ratio("Anthropic Messages / chat", 0.90, "ballast-messages")
    r = _ratio(res.cell("ballast-responses", 32).rps, g32.rps)
    add_ratio("req/s @32: Responses / chat", 0.80, r, "ballast-responses", "")
    add_stream_ratio("Responses / chat", 0.90, "ballast-responses")
    r = _ratio(res.cell("ballast-messages-native", 32).rps, g32.rps)
    add_ratio("req/s @32: native Messages / chat", 0.95, r, "ballast-messages-native", "")
    add_stream_ratio("native Messages / chat", 0.95, "ballast-messages-native")
    r = _ratio(res.cell("ballast-anthropic", 32).rps, g32.rps)
    add_ratio(
        "req/s @32: through the Anthropic adapter / pass-through", 0.75, r, "ballast-anthropic", ""
    )
    delta = res.cell("ballast-anthropic", 1).p50 - g1.p50
    add(
        "added p50 @1: Anthropic adapter over pass-through",
        "<= 0.3 ms",
        delta,
        "{:+.3f} ms",
        delta <= 0.3,
    )
    if 8 in res.concurrencies:
        delta = (
            res.stream_cell("ballast-anthropic", 8).ttfc_p50 - res.stream_cell(gateway, 8).ttfc_p50
        )
        add(
            "added TTFC p50 @8: Anthropic adapter over pass-through",
            "<= 0.5 ms",
            delta,
            "{:+.3f} ms",
            delta <= 0.5,
        )
    return out


def checks_table(res: Results) -> list[str]:
    lines = ["| check | goal | measured | result |", "|---|---|---|---|"]
    for c in checks(res):
        verdict = "–" if c.ok is None else ("PASS" if c.ok else "MISS")
        lines.append(f"| {c.name} | {c.goal} | {c.measured} | {verdict} |")
    return lines


def render(res: Results, header: list[str]) -> str:
    parts = [*header, "", *main_table(res), ""]
    notes = [f"- **{t}**: {n}" for t, n in res.notes.items()]
    notes += [
        f"- **{t}**: FAILED mid-run, cells after this are missing: {why}"
        for t, why in res.failed.items()
    ]
    if notes:
        parts += [*notes, ""]
    parts += ["Targets (issue 8), ratios from this run:", "", *checks_table(res), ""]
    stream_errors = [
        f"- {t} @{c}: {res.stream_cell(t, c).first_error}"
        for t in res.targets
        for c in res.concurrencies
        if res.stream_cell(t, c).first_error
    ]
    if stream_errors:
        parts += ["First streaming error per cell:", "", *stream_errors, ""]
    return "\n".join(parts)

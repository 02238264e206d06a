"""The layering of DESIGN.md, measured from the source: every import of a Ballast module
(at the top of a file, inside a function or under TYPE_CHECKING) points down the layers,
and nothing imports in a circle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "ballast"

# Bottom to top. A package may import the ones before it in this list, never those after.
LAYERS = (
    "resilience",
    "upstream",
    "stream",
    "providers",
    "state",
    "routing",
    "pipeline",
    "mcp",
    "api",
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in ROOT.rglob("*.py") if "migrations" not in p.parts}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            edges[name].update(m for m in found if m in modules and m != name)
    for name in modules:
        edges.setdefault(name, set())
    return dict(edges)


GRAPH = _graph()


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(pkg: str) -> set[str]:
    return {
        package(target)
        for source, targets in GRAPH.items()
        if package(source) == pkg
        for target in targets
        if package(target) != pkg
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    assert "ballast.routing.router" in GRAPH["ballast.pipeline.pipeline"]
    assert len(GRAPH) > 80


def test_no_module_imports_another_in_a_circle() -> None:
    assert _cycles(GRAPH) == []


def test_no_package_imports_another_in_a_circle() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for source, targets in GRAPH.items():
        for target in targets:
            if package(source) != package(target):
                packages[package(source)].add(package(target))
    assert _cycles(dict(packages)) == []


def test_the_bottom_layer_imports_nothing_above_it() -> None:
    assert imports_of("resilience") == set()


def test_the_settings_import_only_the_bottom_layer() -> None:
    # Every layer reads its settings, so the config may import none of them.
    assert imports_of("config") <= {"resilience"}


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    assert imports_of(layer) & above == set()


def test_the_transport_and_the_state_know_no_route_and_no_api() -> None:
    above = {"stream", "routing", "state", "api", "providers", "pipeline"}
    assert imports_of("upstream") & above == set()
    assert imports_of("state") & {"routing", "api", "pipeline"} == set()


def test_the_simulator_imports_nothing_it_tests() -> None:
    # Only its own modules, and the small aiohttp runner it shares with the actor.
    outside = {
        target
        for source, targets in GRAPH.items()
        if package(source) == "sim"
        for target in targets
        if package(target) != "sim"
    }
    assert outside <= {"ballast.server.aioweb"}


def test_no_module_imports_the_app_object() -> None:
    importers = {s for s, targets in GRAPH.items() if "ballast.app" in targets}
    assert importers <= {"ballast.demo"}  # the demo starts a gateway in its own process


def test_the_stream_events_know_only_the_transport_below_them() -> None:
    # Chat semantics read typed events; the framing they are cut from is the transport's.
    assert imports_of("stream") <= {"resilience", "upstream"}

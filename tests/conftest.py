from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from ballast.sim.server import SimServer
from tests.stack import Stack

# Hypothesis would keep its example database in `.hypothesis/` of the working tree; this
# one goes when the run ends.
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="ballast-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)


@pytest.fixture(autouse=True)
def _outside_the_tree(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test runs in a directory of its own: what a gateway writes relative to where it
    runs (the default `ballast.db`, the spend journal) never lands in the working tree."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def stack() -> Iterator[Stack]:
    running = Stack()
    try:
        yield running
    finally:
        running.close()


def sim_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What the `sim` marker of a test asks of its simulator: `sim(default=..., name=...)`."""
    marker = request.node.get_closest_marker("sim")
    return dict(marker.kwargs) if marker else {}


@pytest.fixture
def sim(stack: Stack, request: pytest.FixtureRequest) -> SimServer:
    """A simulator on the test's stack, as its `sim` marker asks (default "ok")."""
    return stack.sim(**sim_options(request))

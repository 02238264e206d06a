"""`ballast` run in a child process in which some modules cannot be imported, as on a
machine where an optional extra was never installed: a meta path finder placed first
refuses them (and everything under them) before the real finders are asked."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

_PRELUDE = """
import runpy, sys
hidden = {hidden!r}

class Hide:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in hidden):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Hide)
sys.argv = ["ballast", *sys.argv[1:]]
runpy.run_module("ballast", run_name="__main__")
"""


def run_without(
    hidden: tuple[str, ...],
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """`ballast *args` with the `hidden` modules missing; its output, never raising."""
    child_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE.format(hidden=hidden), *args],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
        check=False,
    )

"""docs/config.md is the settings schema as it is: regenerate it with
`python scripts/config_docs.py` after changing a setting. Every key has a meaning."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_docs", ROOT / "scripts/config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_current() -> None:
    text = _generator().render()
    written = (ROOT / "docs" / "config.md").read_text()
    assert written == text, "docs/config.md is stale: run python scripts/config_docs.py"


def test_every_key_has_a_default_and_a_meaning() -> None:
    rows = [line for line in _generator().render().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    for row in rows:
        key, _type, default, meaning = (cell.strip() for cell in row.strip("|").split(" | "))
        assert default, key
        assert meaning, f"{key} has no meaning: describe it in ballast/config/"
    keys = {row.split("`")[1] for row in rows}
    assert {"server.master_key", "models[].deployments[].headers", "fleet.fallback_poll"} <= keys

"""Every YAML block in the README and docs/ passes `ballast check-config`: a new operator
copies them. A whole config is checked as it is; a block marked `<!-- fragment -->` is
checked merged into a minimal config with one model. Variables the block needs get
stand-in values, as the operator's environment would give real ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ballast.cli import cli
from tests.docs import Block, blocks, pages

NEEDED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # no default: must be set
BASE: dict[str, Any] = {
    "models": [{"name": "chat", "deployments": [{"id": "base", "url": "http://127.0.0.1:9/v1"}]}]
}
FRAGMENT = "fragment"


def yaml_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page) if b.lang == "yaml"]


def merged(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """`part` over `base`, mapping by mapping (a list in `part` replaces the base's)."""
    out = dict(base)
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def check_config(data: Any, tmp_path: Path) -> tuple[int, str]:
    """`ballast check-config` on `data`, in process: its exit code and what it printed."""
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(cli, ["check-config", str(path)])
    return result.exit_code, result.output


def test_every_yaml_block_is_found() -> None:
    """No block escapes the extraction (an indented fence, a marker the reader misses)."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        found = [b for b in blocks(page) if b.lang == "yaml"]
        assert len(found) == text.count("```yaml"), page.name
        for block in found:
            assert block.marker in ("", FRAGMENT) or block.marker.startswith("quickstart:"), (
                f"{block.name}: unknown marker {block.marker!r}"
            )
    assert len(yaml_blocks()) >= 10


@pytest.mark.parametrize("block", yaml_blocks(), ids=lambda b: b.name)
def test_every_yaml_block_passes_check_config(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.name}: a config is a mapping"
    for name in NEEDED.findall(block.text):
        monkeypatch.setenv(name, f"stand-in-{name.lower()}")
    if block.marker == FRAGMENT:
        alone, _ = check_config(data, tmp_path)
        assert alone != 0, f"{block.name} is a whole config: drop its fragment marker"
        data = merged(BASE, data)
    code, output = check_config(data, tmp_path)
    assert code == 0, f"{block.name} fails check-config:\n{output}\n--- the block:\n{block.text}"
    assert "stand-in-" not in output  # and no secret is printed back


def test_a_fragment_is_merged_section_by_section() -> None:
    part = {"server": {"port": 9}, "models": [{"name": "other"}]}
    base = {"server": {"host": "h", "port": 1}, "models": [{"name": "chat"}]}
    assert merged(base, part) == {"server": {"host": "h", "port": 9}, "models": [{"name": "other"}]}
    assert base["server"] == {"host": "h", "port": 1}  # the base is left as it was


def test_a_block_that_fails_check_config_is_caught(tmp_path: Path) -> None:
    """The check can fail: the README's old examples without `models` are refused."""
    code, output = check_config({"state": {"redis_timeout": 0.05}}, tmp_path)
    assert code == 2
    assert "models: Field required" in output

"""Every YAML example in the README passes `ballast check-config` as written: a new
operator copies them. A fragment without `models` is checked inside a minimal config;
variables without a default get a stand-in value, as the operator's environment would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ballast.cli import cli

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
NEEDED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # no default
BASE_MODELS = [{"name": "chat", "deployments": [{"id": "base", "url": "http://127.0.0.1:9000/v1"}]}]


def examples() -> list[str]:
    found = BLOCK.findall((ROOT / "README.md").read_text())
    assert len(found) >= 4  # the extraction itself works
    return found


@pytest.mark.parametrize("text", examples(), ids=lambda t: t.split("\n", 1)[0][:30])
def test_every_readme_example_passes_check_config(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(text)
    assert isinstance(data, dict), "an example is a mapping"
    if "models" not in data:
        data["models"] = BASE_MODELS
    for name in NEEDED.findall(text):
        monkeypatch.setenv(name, f"stand-in-{name.lower()}")
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(cli, ["check-config", str(path)])
    assert result.exit_code == 0, f"{result.output}\n--- the example:\n{text}"
    assert "stand-in-" not in result.output  # and no secret is printed back

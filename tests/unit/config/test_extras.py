"""A config that needs an optional extra which is not installed is refused by
`check-config`, naming what needs it and the pip command that installs it; the child
process hides the extra's modules as a machine without it would lack them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.config.extras import EXTRAS, PROVIDER_EXTRAS, install_command
from tests.hidden import run_without

_BEDROCK = {
    "id": "br",
    "provider": "bedrock",
    "model": "anthropic.claude-3-haiku",
    "aws": {"region": "us-east-1"},
}
_VERTEX = {
    "id": "vx",
    "provider": "vertex",
    "model": "gemini-2.0-flash",
    "google": {"project": "p", "location": "us-central1"},
}
_OPENAI = {"id": "oa", "url": "http://127.0.0.1:9"}


def _config(tmp_path: Path, *deployments: dict[str, Any], **sections: Any) -> str:
    path = tmp_path / "ballast.yaml"
    data = {"models": [{"name": "m", "deployments": list(deployments)}], **sections}
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("deployment", "hidden", "extra"),
    [
        (_BEDROCK, ("botocore",), "bedrock"),
        (_VERTEX, ("google.auth",), "vertex"),
        (_VERTEX, ("requests",), "vertex"),
    ],
)
def test_a_provider_without_its_extra_is_refused(
    tmp_path: Path, deployment: dict[str, Any], hidden: tuple[str, ...], extra: str
) -> None:
    result = run_without(hidden, "check-config", _config(tmp_path, _OPENAI, deployment))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"models[0].deployments[1] ({deployment['id']}): provider {extra}")
    assert f"'{extra}' extra" in line and line.endswith(f"pip install 'ballast[{extra}]'")


def test_tracing_without_its_extra_is_refused_whatever_turned_it_on(tmp_path: Path) -> None:
    hidden = ("opentelemetry.sdk",)
    by_setting = run_without(
        hidden, "check-config", _config(tmp_path, _OPENAI, observe={"tracing": True})
    )
    assert by_setting.returncode == 2
    assert by_setting.stderr.startswith("observe.tracing: tracing needs the 'tracing' extra")
    assert "pip install 'ballast[tracing]'" in by_setting.stderr
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    by_variable = run_without(hidden, "check-config", _config(tmp_path, _OPENAI), env=endpoint)
    assert by_variable.returncode == 2
    assert by_variable.stderr.startswith("OTEL_EXPORTER_OTLP_ENDPOINT: tracing needs")
    disabled = {**endpoint, "OTEL_SDK_DISABLED": "true"}
    off = run_without(hidden, "check-config", _config(tmp_path, _OPENAI), env=disabled)
    assert off.returncode == 0, off.stderr


def test_an_extra_nothing_needs_may_be_missing(tmp_path: Path) -> None:
    hidden = ("botocore", "google.auth", "opentelemetry")
    result = run_without(hidden, "check-config", _config(tmp_path, _OPENAI))
    assert result.returncode == 0, result.stderr
    assert "deployments" in result.stdout


def test_every_extra_a_deployment_needs_is_listed_and_installed_here(tmp_path: Path) -> None:
    """The table the check reads names real extras, and this (development) install has
    them all: the same config passes with nothing hidden."""
    assert set(PROVIDER_EXTRAS.values()) <= set(EXTRAS)
    assert install_command("vertex") == "pip install 'ballast[vertex]'"
    config = _config(tmp_path, _BEDROCK, _VERTEX, observe={"tracing": True})
    result = run_without((), "check-config", config)
    assert result.returncode == 0, result.stderr


def test_the_container_image_installs_every_extra() -> None:
    dockerfile = (Path(__file__).resolve().parents[3] / "Dockerfile").read_text()
    (extras,) = re.findall(r"pip install [^\n]*'\.\[([a-z,]+)\]'", dockerfile)
    assert set(extras.split(",")) == set(EXTRAS)

"""The package a user installs: `python -m build` makes a wheel that carries the license and
the version, installs with every extra into a fresh virtual environment, and runs there
(`ballast --version`, each extra's provider module, `check-config` of a config that needs
them all). No network: the build uses this environment's setuptools (`--no-isolation`) and
the fresh environment finds the dependencies already installed here (a path file), so pip
resolves everything locally (`--no-index`)."""

from __future__ import annotations

import email
import importlib.metadata
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ballast.config.extras import EXTRAS, PROVIDER_EXTRAS

ROOT = Path(__file__).resolve().parents[2]
_TREE_FILES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE")


def _run(*command: str | Path, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of the tree, so the build leaves nothing in the checkout."""
    tmp_path = tmp_path_factory.mktemp("build")
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", tree / "src", ignore=ignore)
    for name in _TREE_FILES:
        shutil.copy(ROOT / name, tree / name)
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, tree)
    (wheel,) = dist.glob("ballast-*.whl")
    return wheel


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def _brought_by(requirements: list[str], extra: str) -> set[str]:
    """The distributions installing `ballast[extra]` brings, following each requirement
    (with its own extras) through the metadata installed here."""
    todo = [r for r in map(Requirement, requirements) if _applies(r, {extra})]
    brought: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in brought:
            continue
        brought.add(name)
        wanted = set(requirement.extras)
        for line in importlib.metadata.requires(requirement.name) or []:
            nested = Requirement(line)
            if _applies(nested, wanted):
                todo.append(nested)
    return brought


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras})


def _owner(module: str) -> str:
    """The installed distribution whose files hold `module`."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    origin = Path(spec.origin).resolve()
    for dist in importlib.metadata.distributions():
        for file in dist.files or ():
            if Path(str(dist.locate_file(file))).resolve() == origin:
                return canonicalize_name(dist.metadata["Name"])
    raise AssertionError(f"no installed distribution holds {module}")


def test_the_wheel_carries_the_license_the_version_and_every_extra(wheel: Path) -> None:
    metadata = _metadata(wheel)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert metadata["Version"] == project["version"]
    assert metadata["License-Expression"] == "Apache-2.0"
    assert set(metadata.get_all("License-File") or ()) == {"LICENSE", "NOTICE"}
    assert any(c.startswith("Programming Language :: Python :: 3") for c in project["classifiers"])
    assert set(EXTRAS) <= set(metadata.get_all("Provides-Extra") or ())
    requirements = metadata.get_all("Requires-Dist") or []
    for extra, modules in EXTRAS.items():
        brought = _brought_by(requirements, extra)
        for module in modules:
            assert _owner(module) in brought, f"ballast[{extra}] does not bring {module}"


def test_the_wheel_installs_with_every_extra_in_a_fresh_environment(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # The dependencies installed here, seen by the new environment after its own packages.
    (Path(purelib.strip()) / "ballast-test-deps.pth").write_text("\n".join(site.getsitepackages()))
    extras = ",".join(sorted(EXTRAS))
    installed = _run(
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--disable-pip-version-check",
        f"ballast[{extras}] @ {wheel.as_uri()}",
    )
    assert "does not provide the extra" not in installed
    version = _metadata(wheel)["Version"]
    assert _run(venv / "bin" / "ballast", "--version").strip() == f"ballast {version}"

    modules = [f"ballast.providers.{p}" for p in PROVIDER_EXTRAS] + ["ballast.observe.tracing"]
    modules += [m for extra in EXTRAS.values() for m in extra]
    program = "import importlib, ballast\n"
    program += "".join(f"importlib.import_module({m!r})\n" for m in modules)
    program += "print(ballast.__file__)"
    where = Path(_run(python, "-c", program, cwd=tmp_path).strip())
    assert where.is_relative_to(venv.resolve()) or where.is_relative_to(venv)

    config = tmp_path / "ballast.yaml"
    bedrock = {"id": "br", "provider": "bedrock", "model": "m", "aws": {"region": "us-east-1"}}
    vertex = {
        "id": "vx",
        "provider": "vertex",
        "model": "m",
        "google": {"project": "p", "location": "us-central1"},
    }
    data = {
        "observe": {"tracing": True},
        "models": [{"name": "m", "deployments": [bedrock, vertex]}],
    }
    config.write_text(yaml.safe_dump(data))
    checked = _run(venv / "bin" / "ballast", "check-config", config, cwd=tmp_path)
    assert "provider: bedrock" in checked and "provider: vertex" in checked

"""docs/source-map.md names every package and module of src/ballast/, and nothing that is
not there: a map that lists two of seventeen providers misleads a newcomer."""

from __future__ import annotations

import re

from tests.docs import ROOT, blocks

SRC = ROOT / "src" / "ballast"
MODULE = re.compile(r"\b(\w+\.py)\b")
FOLDER = re.compile(r"(?<![\w/.])([a-z_]+)/")
TOP = "(top)"  # the modules of src/ballast/ itself


def _sections() -> dict[str, str]:
    """The map's text per package (and the top-level modules' line), from its tree."""
    tree = next(b.text for b in blocks(ROOT / "docs" / "source-map.md") if "src/ballast/" in b.text)
    sections: dict[str, str] = {}
    current = None
    for line in tree.splitlines()[1:]:
        if not line.startswith(" "):
            break  # tests/, bench/: beyond src/ballast/
        head = re.match(r"  (\w+)/ ", line)
        if head is not None:
            current, line = head.group(1), line[head.end() :]
        elif re.match(r"  \w+\.py", line):
            current = TOP
        assert current is not None, line
        sections[current] = sections.get(current, "") + line + "\n"
    return sections


def _modules(package: str) -> set[str]:
    """The module files of a package, at any depth; migrations' version scripts are data."""
    folder = SRC if package == TOP else SRC / package
    found = folder.glob("*.py") if package == TOP else folder.rglob("*.py")
    return {p.name for p in found if p.name != "__init__.py" and p.parent.name != "versions"}


def test_every_package_is_on_the_map() -> None:
    packages = {p.parent.name for p in SRC.glob("*/*.py")}  # some are namespace packages
    assert set(_sections()) == packages | {TOP}


def test_each_package_names_every_module_it_has_and_no_other() -> None:
    for package, text in _sections().items():
        named = set(MODULE.findall(text)) - {"__init__.py"}
        assert named == _modules(package), package
        folder = SRC if package == TOP else SRC / package
        for sub in FOLDER.findall(text):
            assert any(p.is_dir() and p.name == sub for p in folder.rglob("*")), (package, sub)


def test_a_module_missing_from_the_map_is_noticed() -> None:
    providers = _sections()["providers"]
    assert "bedrock_answer.py" in _modules("providers")
    assert set(MODULE.findall(providers.replace("bedrock_answer.py", ""))) != _modules("providers")

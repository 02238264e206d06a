"""docs/config.md is the settings schema as it is: regenerate it with
`python scripts/config_docs.py` after changing a setting. Every key has a meaning."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from ballast.config import PROVIDERS, ConfigError, parse_settings
from tests.docs import pages

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
    rendered = _generator().render().splitlines()
    rows = [line for line in rendered if re.match(r"\| `[a-z]", line)]  # not the variables
    assert len(rows) > 100
    for row in rows:
        key, _type, default, meaning = (cell.strip() for cell in row.strip("|").split(" | "))
        assert default, key
        assert meaning, f"{key} has no meaning: describe it in ballast/config/"
    keys = {row.split("`")[1] for row in rows}
    assert {"server.master_key", "models[].deployments[].headers", "fleet.fallback_poll"} <= keys


# A default stated in prose: a setting's name in backticks, then its value in brackets,
# as in "`fleet.fallback_poll` (0.25 s)". The name is the key's full path, or any tail of
# it that names one key only.
CLAIM = re.compile(r"`([a-z_][\w.\[\]<>]*)`\s+\(([^()]*)\)")
NUMBER = re.compile(r"(\d[\d,]*(?:\.\d+)?) ?(ms|s|min|h|KiB|MiB|GiB)?(?![\w.])")
UNITS = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "KiB": 1024, "MiB": 2**20, "GiB": 2**30}


def schema_defaults() -> dict[str, Any]:
    return {
        key: field.get_default(call_default_factory=True)
        for key, field in _generator().fields().items()
        if not field.is_required()
    }


def stated_defaults(text: str, defaults: dict[str, Any]) -> tuple[int, list[str]]:
    """How many defaults `text` states, and every one that is not the schema's."""
    count, problems = 0, []
    for match in CLAIM.finditer(text):
        name, inside = match.groups()
        number = NUMBER.match(inside)
        keys = [name] if name in defaults else [k for k in defaults if k.endswith(f".{name}")]
        if number is None or not keys:
            continue  # not a number, or not a setting
        if len(keys) > 1:
            problems.append(f"`{name}` ({inside}): which one? Name it by its full path")
            continue
        count += 1
        stated = float(number.group(1).replace(",", "")) * UNITS.get(number.group(2) or "s", 1)
        actual = defaults[keys[0]]
        if not isinstance(actual, int | float) or abs(stated - actual) > 1e-9 * max(1, actual):
            problems.append(f"`{name}` ({inside}): the default is {actual!r}")
    return count, problems


def test_every_default_the_docs_state_is_the_schemas() -> None:
    defaults = schema_defaults()
    total, problems = 0, []
    for page in pages():
        if page.name == "config.md":
            continue  # generated from the schema itself
        count, found = stated_defaults(page.read_text(encoding="utf-8"), defaults)
        total += count
        problems += [f"{page.name}: {problem}" for problem in found]
    assert not problems, "\n".join(problems)
    assert total >= 30  # the docs do state defaults this way


def test_a_default_stated_wrong_is_caught() -> None:
    defaults = schema_defaults()
    assert stated_defaults("every `fleet.fallback_poll` (0.25 s), so", defaults) == (1, [])
    assert stated_defaults("`upstream.max_response_bytes` (32 MiB)", defaults) == (1, [])
    assert stated_defaults("`state.redis_timeout` (50 ms)", defaults) == (1, [])
    _, problems = stated_defaults("every `fleet.fallback_poll` (0.5 s), so", defaults)
    assert problems == ["`fleet.fallback_poll` (0.5 s): the default is 0.25"]
    _, problems = stated_defaults("`open_time` (5 s)", defaults)  # a deployment's or Redis's?
    assert problems and "full path" in problems[0]
    assert stated_defaults("`key_cache_ttl` (30 s)", defaults) == (1, [])  # one key only
    assert stated_defaults("`ballast_breaker_state` (0 closed)", defaults) == (0, [])


def test_the_url_default_names_the_providers_that_need_no_url() -> None:
    """A deployment without `url` loads exactly for the providers the reference names."""
    row = next(r for r in _generator().render().splitlines() if "`models[].deployments[].url`" in r)
    default = row.split(" | ")[2]
    sections: dict[str, dict[str, Any]] = {
        "bedrock": {"aws": {"region": "us-east-1"}},
        "vertex": {"google": {"project": "p", "location": "us-central1"}},
        "gemini": {"api_key": "k"},
        "azure": {"azure": {"api_version": "2024-10-21"}, "model": "m"},
    }
    for provider in PROVIDERS:
        deployment = {"id": "d", "provider": provider, **sections.get(provider, {})}
        config = {"models": [{"name": "m", "deployments": [deployment]}]}
        try:
            parse_settings(config, {})
            loads = True
        except ConfigError:
            loads = False
        assert loads == (f"`{provider}`" in default), provider

"""compose.yaml, checked without docker: with only the variables its header documents it
resolves and every instance's config passes validation; a missing required secret stops
it with a message naming the variable; no instance count is configured (the instances count
each other through Redis); the proxy sends traffic (admin included) to every instance; each
instance has its own name and port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
# Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}.
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?])([^}]*))?\}")


class Missing(Exception):
    pass


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, colon, kind, text = match.groups()
        given = env.get(name)
        unset = given is None or (colon == ":" and given == "")
        if kind == "?" and unset:
            raise Missing(f"{name}: {text}")
        if kind == "-" and unset:
            return text
        return given or ""

    return _VAR.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


def documented() -> dict[str, str]:
    """The variables the compose file's header names, with stand-in values."""
    header = (ROOT / "compose.yaml").read_text().split("\nname:", 1)[0]
    names = set(re.findall(r"\b(BALLAST_[A-Z_]+|OPENAI_API_KEY|POSTGRES_PASSWORD)\b", header))
    return {name: f"stand-in-{name.lower()}-0123456789" for name in names}


def compose(env: dict[str, str]) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    resolved: dict[str, Any] = _interpolate(data, env)
    return resolved


def instances(resolved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in resolved["services"].items() if n.startswith("ballast-")}


def test_the_documented_variables_start_it() -> None:
    env = documented()
    assert {"BALLAST_MASTER_KEY", "OPENAI_API_KEY"} <= set(env)
    resolved = compose(env)
    gateways = instances(resolved)
    assert len(gateways) == 2
    names = set()
    for service in gateways.values():
        environment = {k: str(v) for k, v in service["environment"].items()}
        names.add(environment["BALLAST_INSTANCE_ID"])
        assert "BALLAST_INSTANCES" not in environment
        settings = load_settings(ROOT / "deploy" / "ballast.yaml", environ=environment)
        assert settings.state.instances == 1  # until their heartbeats have counted them
        assert settings.state.redis_url and settings.state.database_url.startswith("postgresql")
        assert settings.server.master_key is not None
    assert len(names) == len(gateways)  # the fleet view tells them apart
    ports = [p for s in gateways.values() for p in s.get("ports", [])]
    assert len(set(ports)) == len(gateways)  # each has a port of its own (metrics)


@pytest.mark.parametrize("name", ["BALLAST_MASTER_KEY", "OPENAI_API_KEY"])
def test_a_missing_secret_is_a_clear_error(name: str) -> None:
    env = documented()
    del env[name]
    with pytest.raises(Missing, match=name):
        compose(env)


def test_the_proxy_reaches_every_instance_admin_included() -> None:
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    upstream = re.search(r"upstream ballast \{(.*?)\}", nginx, re.DOTALL)
    assert upstream is not None
    servers = set(re.findall(r"server (ballast-\d+):8080", upstream.group(1)))
    assert servers == set(instances(compose(documented())))
    blocked = re.findall(r"location [=~^ ]*(\S+) \{ return 40\d", nginx)
    assert not any(path.startswith("/admin") for path in blocked)

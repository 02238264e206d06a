"""Reading a config: YAML, `${VAR}` and `${VAR:-default}` expansion, the environment's
overrides, and validation into `Settings` with every problem named by its path. Done once
at start-up (and on a reload), never on the hot path."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ballast.config.errors import ConfigError
from ballast.config.settings import Settings

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, environ: dict[str, str], path: str = "") -> Any:
    """Expand ${VAR} and ${VAR:-default} in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {k: expand_env(v, environ, _join(path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        missing: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ and environ[name] != "":
                return environ[name]
            if default is not None:
                return default
            missing.append(name)
            return ""

        expanded = _ENV_PATTERN.sub(substitute, value)
        if missing:
            raise ConfigError([f"{path}: environment variable {missing[0]} is not set"])
        return expanded
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else _join_dot(out, part)
    return out or "(root)"


def _join_dot(out: str, part: str) -> str:
    return f".{part}" if out else part


# Settings the environment sets whatever the file says (docs/config.md lists them).
ENV_OVERRIDES = {
    "BALLAST_REDIS_BREAKER_FAILURE_THRESHOLD": ("state", "redis_breaker", "failure_threshold"),
    "BALLAST_REDIS_BREAKER_RECOVERY_TIMEOUT": ("state", "redis_breaker", "open_time"),
    "BALLAST_REDIS_URL": ("state", "redis_url"),
    "BALLAST_DATABASE_URL": ("state", "database_url"),
}
# A setting's former names, still read from a file: an override replaces them as well.
_FORMER_NAMES = {"open_time": ("recovery_timeout",)}


def _apply_env_overrides(data: dict[str, Any], environ: dict[str, str]) -> None:
    for name, path in ENV_OVERRIDES.items():
        value = environ.get(name)
        if not value:
            continue
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        for former in _FORMER_NAMES.get(path[-1], ()):
            node.pop(former, None)
        node[path[-1]] = value


def parse_settings(data: Any, environ: dict[str, str] | None = None) -> Settings:
    """Validate a parsed YAML tree; every problem is reported with its path."""
    if not isinstance(data, dict):
        raise ConfigError(["(root): expected a mapping with at least a 'models' list"])
    env = dict(os.environ) if environ is None else environ
    expanded = expand_env(data, env)
    _apply_env_overrides(expanded, env)
    try:
        return Settings.model_validate(expanded)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{_format_loc(tuple(err['loc']))}: {message}")
        raise ConfigError(lines) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, never the text around it: the offending line may hold a
    secret, and this message reaches the terminal and, on a reload, the log."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        return f"not valid YAML{where}: {problem}"
    return f"not valid YAML ({type(exc).__name__})"


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc.strerror})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: {yaml_problem(exc)}"]) from None
    return parse_settings(data, environ)

"""The optional extras (`pip install 'ballast[NAME]'`): what each one brings, and which of
them a config needs. `check-config` and `serve` ask before anything is served, so a missing
extra is one clear line with the command that installs it, not a traceback on the first
request to a Bedrock deployment."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ballast.config.settings import Settings

# Each extra of pyproject.toml, and the modules Ballast imports from it (a test holds the
# two together: installing the extra brings every module named here).
EXTRAS: dict[str, tuple[str, ...]] = {
    "bedrock": ("botocore",),
    "vertex": ("google.auth", "requests"),  # google-auth's token refresh goes over requests
    "tracing": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"),
}
# The providers whose deployments need an extra.
PROVIDER_EXTRAS: dict[str, str] = {"bedrock": "bedrock", "vertex": "vertex"}


def install_command(extra: str) -> str:
    return f"pip install 'ballast[{extra}]'"


def installed(extra: str) -> bool:
    """True when every module the extra brings can be imported (found, not imported)."""
    for module in EXTRAS[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except ImportError:  # a parent package is missing too
            return False
    return True


def missing_extras(settings: Settings, tracing_from: str | None) -> list[str]:
    """One `path: message` line per part of the config whose extra is not installed.
    `tracing_from` names what turned tracing on (a setting or a variable), None if off."""
    needed: list[tuple[str, str]] = []
    for i, group in enumerate(settings.models):
        for j, deployment in enumerate(group.deployments):
            extra = PROVIDER_EXTRAS.get(deployment.provider)
            if extra is not None:
                where = f"models[{i}].deployments[{j}] ({deployment.id}): provider {extra}"
                needed.append((where, extra))
    if tracing_from is not None:
        needed.append((f"{tracing_from}: tracing", "tracing"))
    found: dict[str, bool] = {}
    lines = []
    for where, extra in needed:
        if extra not in found:
            found[extra] = installed(extra)
        if not found[extra]:
            lines.append(
                f"{where} needs the '{extra}' extra, which is not installed;"
                f" install it with: {install_command(extra)}"
            )
    return lines

"""Writes docs/config.md, the config reference, from the settings schema (ballast.config):
every key with its type, default and meaning. `python scripts/config_docs.py` rewrites the
file; tests/unit/test_config_docs.py fails when it is out of date."""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ballast.config import DEFAULT_URLS, Settings
from ballast.config.loading import ENV_OVERRIDES

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"

HEADER = """# Configuration reference

Generated from the settings schema (`src/ballast/config/`) by
`python scripts/config_docs.py`; do not edit by hand. YAML; `${VAR}` and
`${VAR:-default}` expand from the environment in any string. `ballast check-config FILE`
prints the resolved config (secrets masked) or every error with its path.

`models[]` is a list, `<name>` a key of your choosing (a model name, a backend name).
How a file is read, checked and reloaded, with an annotated example:
[configuration.md](configuration.md).
"""

# What a key's default is when the schema cannot say it by itself.
_URL = "models[].deployments[].url"
# Providers whose URL follows from their own section (`_cloud_url` in config/deployment.py).
_DERIVED_URLS = {"bedrock": "`aws.region`", "vertex": "`google.location`"}


# Meanings for keys whose schema field has no description of its own. A key with neither
# fails tests/unit/test_config_docs.py: describe new settings in ballast/config/.
MEANINGS = {
    "server.host": "address to listen on (`--host` overrides)",
    "server.port": "port to listen on (`--port` overrides)",
    "server.max_body_bytes": "largest request body; larger ones get 413",
    "timeouts.connect": "TCP and TLS connect to a deployment",
    "timeouts.first_token": "request sent to the first token of a stream (then failover)",
    "timeouts.inter_chunk": "longest silence between two stream events",
    "upstream.keepalive_timeout": "an idle pooled upstream connection is closed after this",
    "routing.max_attempts": "upstream attempts per client request, all deployments together",
    "routing.backoff_base": "full-jitter exponential backoff before retrying one deployment",
    "routing.backoff_cap": "the longest such backoff",
    "routing.retry_budget_ratio": "retries allowed as a share of requests over 10 s",
    "routing.retry_budget_min_per_second": "retries always allowed per second on top",
    "routing.max_retry_after_wait": "longest Retry-After waited out before a fallback model",
    "routing.health_window": "seconds of history a deployment's health score is made of",
    "routing.continuation": "continue a stream broken after its first token on another deployment",
    "routing.breaker": "each deployment's circuit breaker",
    "state.redis_url": "Redis for shared limits, spend, cache, handles and admin pub/sub",
    "state.database_url": "SQLite (one instance) or PostgreSQL (several) for keys, spend, jobs",
    "state.database_timeout": "one database call",
    "state.spend_flush_interval": "seconds between spend batches written to the database",
    "state.spend_journal": "file holding spend not yet in the database (survives a crash)",
    "jobs.backends.<name>.protocol": "the backend's API",
    "jobs.backends.<name>.url": "the backend's base URL",
    "jobs.backends.<name>.api_key": "sent as a bearer token",
    "jobs.backends.<name>.poll_interval": "first status poll interval (grows with jitter)",
    "jobs.backends.<name>.max_poll_interval": "longest status poll interval",
    "jobs.backends.<name>.lost_contact_timeout": "no answer at all for this long: failed",
    "jobs.backends.<name>.submit_path": "http protocol: where a job is submitted",
    "jobs.backends.<name>.status_path": "http protocol: a job's status",
    "jobs.backends.<name>.cancel_path": "http protocol: cancelling a job",
    "jobs.backends.<name>.status_map": "http protocol: the backend's statuses to Ballast's",
    "jobs.claim_interval": "seconds between looks for jobs to adopt",
    "prices.<name>.input": "dollars per million input tokens",
    "prices.<name>.output": "dollars per million output tokens",
    "models[].name": "what clients ask for; may be a wildcard like `fb-*`",
    "models[].deployments": "the upstreams serving this model",
    "models[].deployments[].id": "unique name (metrics, logs, admin)",
    "models[].deployments[].url": "the upstream's base URL",
    "models[].deployments[].api_key": "the upstream's key (never logged nor shown)",
    "models[].deployments[].provider": "the upstream's protocol",
    "models[].deployments[].weight": "share of traffic with `strategy: weighted`",
    "models[].deployments[].timeouts": "this deployment's overrides of `timeouts`",
    "models[].deployments[].pool_size": "connections to it (default `upstream.pool_size`)",
    "models[].deployments[].headers": "extra headers sent to it (values never shown)",
    "models[].deployments[].tls.ca_file": "PEM CA bundle trusted for it instead of the system's",
    "models[].fallbacks": "other models tried when this one cannot answer",
    "models[].context_fallbacks": "models tried only on context_length_exceeded",
    "models[].strategy": "how a deployment is picked",
}
_OVERRIDE = "models[].deployments[].timeouts."


def meaning_of(key: str, described: str) -> str:
    if described:
        return described
    if key.startswith(_OVERRIDE):
        return f"overrides `timeouts.{key.removeprefix(_OVERRIDE)}` for this deployment"
    return MEANINGS.get(key, "")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg) if not isinstance(arg, str) else None
        if found is not None:
            return found
    return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        return f"map of {_type_name(typing.get_args(annotation)[1])}"
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "secret"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _url_default() -> str:
    """A deployment's `url` is required unless its provider has one or derives one."""
    known = ", ".join(f"`{name}`" for name in DEFAULT_URLS)
    derived = ", ".join(f"`{name}` (from {where})" for name, where in _DERIVED_URLS.items())
    return f"required, except for {derived} and the providers with a URL of their own: {known}"


def _default(field: FieldInfo, key: str = "") -> str:
    if key == _URL:
        return _url_default()
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, SecretStr):
        return "(secret)"
    return f"`{json.dumps(value)}`"


def _former_names(field: FieldInfo, name: str) -> str:
    """A key's other names still read from a file (a renamed key keeps working)."""
    alias = field.validation_alias
    if not isinstance(alias, AliasChoices):
        return ""
    others = [f"`{c}`" for c in alias.choices if isinstance(c, str) and c != name]
    return f" (also read as {', '.join(others)})" if others else ""


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _prefix(key: str, annotation: Any) -> str:
    """How the keys under a section are named: `a[].b` in a list, `a.<name>.b` in a map."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return f"{key}[]."
    if origin is dict:
        return f"{key}.<name>."
    return f"{key}."


def _fields(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        yield key, field
        sub = _model_of(field.annotation)
        if sub is not None:
            yield from _fields(sub, _prefix(key, field.annotation))


def fields() -> dict[str, FieldInfo]:
    """Every key of the settings schema, named as docs/config.md names it."""
    return dict(_fields(Settings, ""))


def _row(key: str, field: FieldInfo) -> str:
    annotation = field.annotation
    meaning = meaning_of(key, " ".join((field.description or "").split()))
    sub = _model_of(annotation)
    if sub is not None:
        meaning = meaning or _doc(sub)
    meaning += _former_names(field, key.rsplit(".", 1)[-1])
    return f"| `{key}` | {_type_name(annotation)} | {_default(field, key)} | {meaning} |"


def _environment() -> list[str]:
    """The settings the environment sets whatever the file says (config/loading.py)."""
    lines = [
        "## Environment overrides\n",
        "Read by Ballast itself, not through `${VAR}`: when set and not empty, each replaces",
        "its setting whatever the file says, so one file serves several environments.\n",
        "| variable | sets |",
        "| --- | --- |",
    ]
    lines += [f"| `{name}` | `{'.'.join(path)}` |" for name, path in ENV_OVERRIDES.items()]
    return [*lines, ""]


def render() -> str:
    lines = [HEADER, *_environment()]
    for name, field in Settings.model_fields.items():
        sub = _model_of(field.annotation)
        lines.append(f"## `{name}`\n")
        if sub is not None and _doc(sub):
            lines.append(_doc(sub) + "\n")
        elif field.description:
            lines.append(" ".join(field.description.split()) + "\n")
        lines.append("| key | type | default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        if sub is not None:
            prefix = _prefix(name, field.annotation)
            lines.extend(_row(key, sub_field) for key, sub_field in _fields(sub, prefix))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)

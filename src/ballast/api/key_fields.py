"""The admin API's fields for keys and teams, checked before the database sees them: every
number within what its column holds, no NUL in a string, models the config serves. Bad
fields are one 400 that names every one of them, never a database error (a 500)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ballast.pipeline.errors import ApiError, bad_request

_INT_FIELDS = ("rpm", "tpm", "max_parallel", "max_concurrent_jobs")
MAX_INT = 2**31 - 1  # the INTEGER columns: PostgreSQL's int4 is the narrowest
MAX_BUDGET = 1e12  # dollars; also keeps sums of spend far from float trouble
MAX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z
MAX_NAME = 200  # the name and model columns
MAX_MODELS = 1000
PERIODS = ("day", "month", "total")


def text_field(value: Any, field: str, max_length: int = MAX_NAME) -> str:
    """A string the database can store (no NUL, bounded), or a 400 naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{field}' must be a non-empty string.", field)
    if "\x00" in value:
        raise bad_request(f"'{field}' must not contain a NUL character.", field)
    if len(value) > max_length:
        raise bad_request(f"'{field}' must be at most {max_length} characters.", field)
    return value


def _count(value: Any, field: str) -> int:
    if type(value) is not int or not 1 <= value <= MAX_INT:  # bool is not a count
        raise bad_request(f"'{field}' must be an integer from 1 to {MAX_INT}.", field)
    return value


def _amount(value: Any, field: str, highest: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= highest:
        raise bad_request(f"'{field}' must be a number from 0 to {highest:.0f}.", field)
    return float(value)


def _models(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_MODELS:
        raise bad_request(f"'models' must be a list of at most {MAX_MODELS} model names.", "models")
    return [text_field(m, "models") for m in value]


def _mcp(value: Any) -> list[str]:
    """`<server>` or `<server>/<tool>` entries: the MCP servers and tools a key may call."""
    if not isinstance(value, list) or len(value) > MAX_MODELS:
        raise bad_request(
            f"'mcp' must be a list of at most {MAX_MODELS} entries ('<server>' or"
            " '<server>/<tool>').",
            "mcp",
        )
    return [text_field(m, "mcp") for m in value]


def _model_budgets(value: Any) -> dict[str, float]:
    field = "model_budgets"
    if not isinstance(value, dict) or len(value) > MAX_MODELS:
        raise bad_request(f"'{field}' must be an object of model names to dollars.", field)
    return {text_field(m, field): _amount(b, field, MAX_BUDGET) for m, b in value.items()}


def _period(value: Any) -> str:
    if value not in PERIODS:
        raise bad_request("'budget_period' must be day, month or total.", "budget_period")
    return str(value)


_CHECKS: dict[str, Any] = {
    "name": lambda v: text_field(v, "name").strip(),
    "models": _models,
    **{field: (lambda f: lambda v: _count(v, f))(field) for field in _INT_FIELDS},
    "budget": lambda v: _amount(v, "budget", MAX_BUDGET),
    "expires_at": lambda v: _amount(v, "expires_at", MAX_TIME),
    "budget_period": _period,
    "team_id": lambda v: text_field(v, "team_id", 40),
    "model_budgets": _model_budgets,
    "mcp": _mcp,
}
_CLEARABLE = set(_CHECKS) - {"name", "budget_period"}  # None clears these in an update
TEAM_FIELDS = ("name", "rpm", "tpm", "max_parallel", "budget", "budget_period")


class _Problems:
    """The bad fields of one request, all of them: a form that sends several mistakes hears
    of every one in one answer, not one per try."""

    def __init__(self) -> None:
        self.errors: list[ApiError] = []

    def check(self, check: Callable[[Any], Any], value: Any) -> Any:
        try:
            return check(value)
        except ApiError as error:
            self.errors.append(error)
            return None

    def add(self, message: str, field: str) -> None:
        self.errors.append(bad_request(message, field))

    def raise_any(self) -> None:
        """One 400 naming every bad field (its `param` lists them), if any was bad."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            fields = ", ".join(dict.fromkeys(e.param for e in self.errors if e.param))
            raise bad_request(" ".join(e.message for e in self.errors), fields)


def _served(models: list[str] | None, serves: Callable[[str], bool] | None) -> str | None:
    """Why a model list names models the config does not serve, or None."""
    if models is None or serves is None:
        return None
    unknown = [m for m in models if not serves(m)]
    if not unknown:
        return None
    shown = ", ".join(f"'{m[:80]}'" for m in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
    return f"'models' names a model the config does not serve: {shown}."


def key_options(
    data: dict[str, Any], serves: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """Validated attributes for a new key; a 400 names every bad one. `serves` says whether
    the config serves a model: a key's model list may name only those."""
    problems = _Problems()
    options = {"name": problems.check(_CHECKS["name"], data.get("name"))}
    for field, check in _CHECKS.items():
        if field != "name" and data.get(field) is not None:
            options[field] = problems.check(check, data[field])
    unserved = _served(options.get("models"), serves)
    if unserved is not None:
        problems.add(unserved, "models")
    problems.raise_any()
    options.setdefault("budget_period", "month")
    return options


def key_changes(
    data: dict[str, Any],
    fields: tuple[str, ...] | None = None,
    serves: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """Validated changes to a key (or, with `fields`, a team): only the fields given; a
    null clears a limit, a budget, the model list, the expiry or the team. A 400 names
    every bad field."""
    problems = _Problems()
    changes = _changes(data, fields or tuple(_CHECKS), problems)
    unserved = _served(changes.get("models"), serves)
    if unserved is not None:
        problems.add(unserved, "models")
    problems.raise_any()
    return changes


def _changes(data: dict[str, Any], allowed: tuple[str, ...], problems: _Problems) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for field, value in data.items():
        if field == "id":
            continue
        if field not in allowed:
            problems.add(f"'{field[:80]}' cannot be changed.", field[:80])
        elif value is None:
            if field not in _CLEARABLE:
                problems.add(f"'{field}' cannot be null.", field)
            else:
                changes[field] = None
        else:
            changes[field] = problems.check(_CHECKS[field], value)
    return changes


def team_options(data: dict[str, Any]) -> dict[str, Any]:
    """Validated attributes for a new team; a 400 names every bad field."""
    problems = _Problems()
    options = _changes({k: v for k, v in data.items() if v is not None}, TEAM_FIELDS, problems)
    if "name" not in options:
        problems.add("'name' is required.", "name")
    problems.raise_any()
    return options

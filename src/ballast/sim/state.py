"""Mutable state of one simulator: behaviour rules, their once/flap/random state, the log."""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from typing import Any

from aiohttp import web

from ballast.sim.behaviour import Behaviour, parse_behaviour
from ballast.sim.prompt_cache import PromptCache

WILDCARD = "*"
MAX_LOGGED_ATTEMPTS = 100_000


class Rule:
    """A behaviour plus the state its ``mode`` needs; a new Rule starts with fresh state."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.set_at = time.monotonic()
        self._failed_models: set[str] = set()
        self._rng = random.Random(behaviour.seed)

    def should_fail(self, model: str) -> bool:
        """Whether an error-mode behaviour (429/500/503) fails this request."""
        b = self.behaviour
        if b.mode == "once":
            if model in self._failed_models:
                return False
            self._failed_models.add(model)
            return True
        if b.mode == "flap":
            return time.monotonic() - self.set_at < b.seconds
        if b.mode == "random":
            return self._rng.random() < b.p
        return True


class SimState:
    """Rules (per model, ``*`` and the app default), header rules and the attempt log."""

    def __init__(self, default: str, name: str, models: tuple[str, ...]) -> None:
        self.name = name
        self.models = models
        self.default = Rule(parse_behaviour(default))
        self.rules: dict[str, Rule] = {}
        # Specs that arrived in ``x-sim-behaviour`` headers keep their own state, so a
        # header like ``500?mode=once`` fails once per model rather than every time.
        self.header_rules: dict[str, Rule] = {}
        self.attempts: deque[dict[str, Any]] = deque(maxlen=MAX_LOGGED_ATTEMPTS)
        self.by_outcome: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()
        self.seen_models: dict[str, None] = {}
        self._next_id = 0
        self.closing = False
        self.prompt_cache = PromptCache()  # what Anthropic's wire reports as cached

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- rules -----------------------------------------------------------------------

    def set_rule(self, model: str, spec: str) -> Rule:
        """Set (or replace, with fresh once/flap/random state) the rule for ``model``."""
        rule = Rule(parse_behaviour(spec))
        self.rules[model] = rule
        return rule

    def clear_rules(self, model: str | None = None) -> int:
        """Remove one rule or all of them; clearing all also resets the default's state."""
        if model is not None:
            return 1 if self.rules.pop(model, None) is not None else 0
        count = len(self.rules)
        self.rules.clear()
        self.header_rules.clear()
        self.default = Rule(self.default.behaviour)
        return count

    def header_rule(self, spec: str) -> Rule:
        """The rule for a header spec (raises ValueError when the spec is invalid)."""
        rule = self.header_rules.get(spec)
        if rule is None:
            rule = Rule(parse_behaviour(spec))
            self.header_rules[spec] = rule
        return rule

    def select(self, model: str, header_spec: str | None) -> Rule:
        """Header first, then the model's rule, then ``*``, then the app default."""
        if header_spec is not None:
            return self.header_rule(header_spec)
        rule = self.rules.get(model) or self.rules.get(WILDCARD)
        return rule if rule is not None else self.default

    def describe_rules(self) -> dict[str, Any]:
        return {
            "default": self.default.behaviour.spec,
            "rules": {model: rule.behaviour.spec for model, rule in self.rules.items()},
        }

    # -- log -------------------------------------------------------------------------

    def record(
        self,
        *,
        model: str | None,
        path: str,
        behaviour: str | None,
        outcome: str,
        stream: bool,
        prefill: bool,
        headers: dict[str, str],
    ) -> dict[str, Any]:
        """Append an attempt and return its (still mutable) record."""
        entry: dict[str, Any] = {
            "time": time.time(),
            "model": model,
            "path": path,
            "behaviour": behaviour,
            "outcome": outcome,
            "stream": stream,
            "prefill": prefill,
            "headers": headers,
            "tokens": 0,
            "disconnected": False,
        }
        self.attempts.append(entry)
        self.by_outcome[outcome] += 1
        if model is not None:
            self.by_model[model] += 1
            self.seen_models.setdefault(model, None)
        return entry

    def clear_log(self) -> int:
        count = len(self.attempts)
        self.attempts.clear()
        self.by_outcome.clear()
        self.by_model.clear()
        return count

    def stats(self) -> dict[str, Any]:
        return {
            "total": sum(self.by_outcome.values()),
            "by_outcome": dict(self.by_outcome),
            "by_model": dict(self.by_model),
        }

    def model_ids(self) -> list[str]:
        ids = dict.fromkeys(self.models)
        ids.update(dict.fromkeys(m for m in self.rules if m != WILDCARD))
        ids.update(self.seen_models)
        return list(ids)


def mask_secret(value: str) -> str:
    """Keep only the last 4 characters of a credential."""
    return "***" + value[-4:]


def seen_headers(
    request: web.Request, masked: tuple[str, ...], kept: tuple[str, ...]
) -> dict[str, str]:
    """What the log keeps of a request's headers: the credentials (`masked`) masked, the
    request's id and the wire's own headers (`kept`) as they came."""
    seen: dict[str, str] = {}
    for name in masked:
        value = request.headers.get(name)
        if value:
            seen[name] = mask_secret(value)
    for name in (*kept, "x-request-id"):
        value = request.headers.get(name)
        if value is not None:
            seen[name] = value
    return seen


SIM_STATE = web.AppKey("ballast_sim_state", SimState)

"""Behaviour specs for the fault-injecting simulator.

A spec is ``NAME`` or ``NAME?k=v&k=v`` (query-string style), for example ``ok?tokens=4``,
``429?retry_after=2``, ``500?mode=flap&seconds=5``, ``cut?after=3`` or
``ok?cache_read=20&cache_write=10&thinking=8``.
:func:`parse_behaviour` turns it into a frozen :class:`Behaviour`; an invalid spec raises
:class:`ValueError` with a message naming the problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

# Parameters shared by every behaviour that ends in a normal answer.
_ANSWER = frozenset(
    {
        "tokens",
        "delay",
        "first_token_delay",
        "latency",
        "tail_p",
        "tail_delay",
        "shape",
        "tool",
        "arg",
        "calls",
        "cache_read",
        "cache_write",
        "cache_write_1h",
        "thinking",
    }
)
# What a chat answer is made of: text, one tool call, or reasoning (`reasoning_content`);
# `agent` (Anthropic's wire) calls the offered tool named `tool` (each required string
# argument `arg`) `calls` times, one call a turn, then answers once the results are back.
SHAPES = ("text", "tool", "reasoning", "agent")
_MODES = frozenset({"mode", "seconds", "p", "seed"})

ALLOWED_PARAMS: dict[str, frozenset[str]] = {
    "ok": _ANSWER,
    "429": _MODES | _ANSWER | {"retry_after"},
    "500": _MODES | _ANSWER,
    "503": _MODES | _ANSWER,
    "reset": frozenset(),
    "hang": frozenset(),
    "slow_first": frozenset({"tokens", "delay"}),
    "cut": _ANSWER | {"after"},
    "stall": _ANSWER | {"after", "seconds"},
    "malformed": _ANSWER | {"at"},
    "no_done": _ANSWER,
    # A stream that sends `after` tokens, then an in-band error event (the provider's own:
    # OpenAI's `data: {"error": ...}`, Anthropic's overloaded `error` event) and ends.
    "error_event": _ANSWER | {"after"},
    "context_length": frozenset(),
    "content_filter": frozenset({"reason"}),
    "409": frozenset({"code"}),
    "401": frozenset(),
    # Upstream garbage: an HTML page (an error page of a proxy in front, or a 200), an answer
    # whose gzip encoding is cut short, and a body labelled with the wrong content-type.
    "html": frozenset({"status"}),
    "gzip_truncated": _ANSWER,
    "wrong_type": _ANSWER,
    # Native wires: a Bedrock event-stream frame with a wrong CRC (event `at`), and a
    # bearer token the remote holds as expired (the first one it sees, from then on).
    # The OpenAI wire answers normally under both.
    "bad_crc": _ANSWER | {"at"},
    "expired_token": _ANSWER,
}

BEHAVIOUR_NAMES: tuple[str, ...] = tuple(ALLOWED_PARAMS)

MODES: tuple[str, ...] = ("always", "once", "flap", "random")

# Defaults for ``seconds``: a flap window for error modes, a pause for ``stall``.
DEFAULT_FLAP_SECONDS = 10.0
DEFAULT_STALL_SECONDS = 3600.0
DEFAULT_SLOW_FIRST_DELAY = 2.0


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One parsed behaviour. ``spec`` is the normalised text it was parsed from."""

    name: str
    spec: str
    # Answer shape (every behaviour that can end in a normal answer).
    tokens: int = 16
    delay: float = 0.0
    first_token_delay: float = 0.0
    latency: float = 0.0
    # A heavy tail: with probability tail_p the first token waits tail_delay more.
    tail_p: float = 0.0
    tail_delay: float = 0.0
    shape: str = "text"
    tool: str = "lookup"  # the tool the agent shape calls
    arg: str = "sim"  # and the value of its required string arguments
    calls: int = 1  # and how many times in a row it calls the tool before answering
    # What the answer bills beyond what it shows, each wire reporting it its own way: prompt
    # tokens read from the provider's prompt cache, written to it for 5 minutes and for an
    # hour (at most what is left of the prompt, in that order), and tokens reasoned before
    # answering (billed as output, never shown).
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    thinking: int = 0
    # 429 / 500 / 503.
    retry_after: float | None = None
    mode: str = "always"
    seconds: float = DEFAULT_FLAP_SECONDS
    p: float = 0.5
    seed: int | None = None
    # cut / stall: tokens sent before the fault; malformed: index of the broken event.
    after: int = 2
    at: int = 1
    # 409 error code; content_filter reason.
    code: str = "conflict"
    reason: str = "hate"
    # html: the HTTP status of the page.
    status: int = 502

    @property
    def is_error_mode(self) -> bool:
        """True for behaviours that fail according to ``mode`` (429, 500, 503)."""
        return self.name in ("429", "500", "503")


def _to_int(key: str, raw: str, minimum: int = 0) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"parameter {key!r} must be >= {minimum}, got {value}")
    return value


def _to_count(key: str, raw: str) -> int:
    return _to_int(key, raw, minimum=1)


def _to_float(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"parameter {key!r} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"parameter {key!r} must be a finite number >= 0, got {raw!r}")
    return value


def _to_probability(key: str, raw: str) -> float:
    value = _to_float(key, raw)
    if value > 1:
        raise ValueError(f"parameter {key!r} must be between 0 and 1, got {raw!r}")
    return value


def _to_mode(key: str, raw: str) -> str:
    if raw not in MODES:
        raise ValueError(f"parameter {key!r} must be one of {', '.join(MODES)}, got {raw!r}")
    return raw


def _to_shape(key: str, raw: str) -> str:
    if raw not in SHAPES:
        raise ValueError(f"{key} must be one of {', '.join(SHAPES)}, got {raw!r}")
    return raw


def _to_text(key: str, raw: str) -> str:
    if not raw:
        raise ValueError(f"parameter {key!r} must not be empty")
    return raw


def _to_status(key: str, raw: str) -> int:
    value = _to_int(key, raw, minimum=200)
    if value > 599:
        raise ValueError(f"parameter {key!r} must be an HTTP status (200-599), got {value}")
    return value


def _to_seed(key: str, raw: str) -> int:
    return _to_int(key, raw, minimum=-(2**63))


_CONVERTERS: dict[str, Callable[[str, str], Any]] = {
    "tokens": _to_int,
    "delay": _to_float,
    "first_token_delay": _to_float,
    "latency": _to_float,
    "tail_p": _to_probability,
    "tail_delay": _to_float,
    "shape": _to_shape,
    "tool": _to_text,
    "arg": _to_text,
    "calls": _to_count,
    "cache_read": _to_int,
    "cache_write": _to_int,
    "cache_write_1h": _to_int,
    "thinking": _to_int,
    "retry_after": _to_float,
    "mode": _to_mode,
    "seconds": _to_float,
    "p": _to_probability,
    "seed": _to_seed,
    "after": _to_int,
    "at": _to_int,
    "code": _to_text,
    "reason": _to_text,
    "status": _to_status,
}


def parse_behaviour(spec: str) -> Behaviour:
    """Parse ``NAME`` or ``NAME?k=v&k=v`` into a :class:`Behaviour`.

    Raises :class:`ValueError` for an unknown name, an unknown or repeated parameter,
    or a value of the wrong type or range.
    """
    if not isinstance(spec, str):
        raise ValueError(f"behaviour spec must be a string, got {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise ValueError("behaviour spec is empty")
    name, _, query = text.partition("?")
    name = name.strip()
    if name not in ALLOWED_PARAMS:
        raise ValueError(
            f"unknown behaviour {name!r}; expected one of {', '.join(BEHAVIOUR_NAMES)}"
        )
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"malformed parameters in behaviour spec {text!r}") from None
    allowed = ALLOWED_PARAMS[name]
    values: dict[str, Any] = {}
    for key, raw in pairs:
        if key not in allowed:
            accepted = ", ".join(sorted(allowed)) or "none"
            raise ValueError(
                f"behaviour {name!r} does not accept parameter {key!r} (accepted: {accepted})"
            )
        if key in values:
            raise ValueError(f"parameter {key!r} given twice in behaviour spec {text!r}")
        values[key] = _CONVERTERS[key](key, raw)

    if name == "slow_first":
        # For slow_first, ``delay`` is the wait before headers and the first token.
        values["first_token_delay"] = values.pop("delay", DEFAULT_SLOW_FIRST_DELAY)
    if name == "stall":
        values.setdefault("seconds", DEFAULT_STALL_SECONDS)
    return Behaviour(name=name, spec=text, **values)

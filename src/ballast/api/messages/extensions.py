"""What of a bridged Messages request reaches each deployment: the extensions of the chat
form some providers carry and others cannot.

A bridged request is translated once into a chat form that keeps every extension a
deployment of its chain carries (providers/base.Adapter.extensions: "cache_control" for
Anthropic and Bedrock, "thinking" for Anthropic), and once more into the plain chat form when
one of them carries none (an OpenAI-compatible upstream): each deployment takes the form it
can say (Adapter.takes), so failover across providers loses nothing it need not. Before any
deployment is chosen, the client is told what may be left out: the names no form carries,
and those of the extensions some deployment of the chain cannot carry."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The extension each name of `Notes.kept` belongs to (the name the client is told).
EXTENSION_OF = {
    "cache_control": "cache_control",
    "thinking": "thinking",
    "redacted_thinking": "thinking",
}


class Notes:
    """What one translation keeps of the extensions (`keep`), and the names of what it left
    out (`dropped`) and of the extensions it carried (`kept`), each once."""

    __slots__ = ("dropped", "keep", "kept")

    def __init__(self, dropped: list[str], keep: frozenset[str], kept: list[str]) -> None:
        self.dropped = dropped
        self.keep = keep
        self.kept = kept

    def drop(self, name: str) -> None:
        if name not in self.dropped:
            self.dropped.append(name)

    def carry(self, name: str) -> bool:
        """Whether this form carries `name` (an extension's, EXTENSION_OF); noted either way."""
        if EXTENSION_OF[name] not in self.keep:
            self.drop(name)
            return False
        if name not in self.kept:
            self.kept.append(name)
        return True

    def mark(self, block: dict[str, Any], into: dict[str, Any]) -> bool:
        """`block`'s `cache_control` onto `into`, where this form carries it: True if so."""
        mark = block.get("cache_control")
        if mark is None or not self.carry("cache_control"):
            return False
        into["cache_control"] = mark
        return True


def left_out(
    dropped: list[str], kept: list[str], carried: Iterable[frozenset[str]]
) -> tuple[str, ...]:
    """The names a request may lose on its way: what its richest form `dropped`, then each
    extension it `kept` that a deployment of the chain (what each `carried`) cannot carry."""
    ways = tuple(carried)
    lost = [name for name in kept if any(EXTENSION_OF[name] not in way for way in ways)]
    return (*dropped, *lost)

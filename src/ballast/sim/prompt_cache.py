"""Anthropic's prompt cache, as the simulator reports it: the system prompt up to each block
marked `cache_control` is a prefix the cache can hold. The longest marked prefix seen before
is read from the cache; what the later marks add is written to it, for as long as each mark
asks (`"ttl": "1h"`, else 5 minutes). The usage says so the way Anthropic's does:
`input_tokens` counts only what was neither read nor written, `cache_creation` splits the
writes by how long they are kept. A behaviour's own cache figures (`cache_read`,
`cache_write`, `cache_write_1h`) stand in for the marks when it gives any."""

from __future__ import annotations

import hashlib
from typing import Any

from ballast.sim.answer import Answer, count_words


class PromptCache:
    """The cached prefixes one simulator has seen (bounded: the oldest half goes)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: dict[str, None] = {}
        self._limit = limit

    def usage(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        """The usage's input fields for `body`, answered with `answer`."""
        prompt = answer.prompt_tokens
        if answer.cached or answer.writes:
            return _fields(prompt, answer.cached, answer.written, answer.written_1h)
        marks = _marked_prefixes(body)
        if not marks:
            return {"input_tokens": prompt}
        read = short = long = 0
        counted = 0  # the words of the prefixes before this one
        for prefix, ttl in marks:
            words = min(count_words([prefix]), prompt)
            key = hashlib.sha256(prefix.encode()).hexdigest()
            if key in self._seen:
                read, short, long = words, 0, 0  # a longer hit replaces what came before
            elif ttl == "1h":
                long += words - counted
            else:
                short += words - counted
            counted = words
            self._remember(key)
        return _fields(prompt, read, short, long)

    def _remember(self, key: str) -> None:
        if key in self._seen:
            return
        if len(self._seen) >= self._limit:
            for old in list(self._seen)[: self._limit // 2]:
                del self._seen[old]
        self._seen[key] = None


def _fields(prompt: int, read: int, short: int, long: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt - read - short - long,
        "cache_creation_input_tokens": short + long,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": short, "ephemeral_1h_input_tokens": long},
    }


def _marked_prefixes(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The system prompt's text up to and with each block marked `cache_control`, shortest
    first, with the mark's time to live."""
    system = body.get("system")
    if not isinstance(system, list):
        return []
    texts: list[str] = []
    marks: list[tuple[str, str]] = []
    for block in system:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            texts.append(block["text"])
            control = block.get("cache_control")
            if isinstance(control, dict):
                marks.append(("\n".join(texts), str(control.get("ttl") or "5m")))
    return marks

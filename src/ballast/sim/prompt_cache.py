"""Anthropic's prompt cache, as the simulator reports it: the system prompt up to its last
`cache_control` mark is written to the cache the first time the simulator sees it and read
from it after that, and the usage says so the way Anthropic's does (`input_tokens` counts
only what was neither read nor written)."""

from __future__ import annotations

import hashlib
from typing import Any

from ballast.sim.answer import count_words


class PromptCache:
    """The cached prefixes one simulator has seen (bounded: the oldest half goes)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: dict[str, None] = {}
        self._limit = limit

    def usage(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, int]:
        """The usage's input fields for `body`, whose prompt is `prompt_tokens` long."""
        prefix = _marked_prefix(body)
        if prefix is None:
            return {"input_tokens": prompt_tokens}
        cached = min(count_words([prefix]), prompt_tokens)
        key = hashlib.sha256(prefix.encode()).hexdigest()
        hit = key in self._seen
        if not hit:
            if len(self._seen) >= self._limit:
                for old in list(self._seen)[: self._limit // 2]:
                    del self._seen[old]
            self._seen[key] = None
        return {
            "input_tokens": prompt_tokens - cached,
            "cache_creation_input_tokens": 0 if hit else cached,
            "cache_read_input_tokens": cached if hit else 0,
        }


def _marked_prefix(body: dict[str, Any]) -> str | None:
    """The system prompt's text up to and with its last block marked `cache_control`."""
    system = body.get("system")
    if not isinstance(system, list):
        return None
    texts: list[str] = []
    marked = None
    for block in system:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            texts.append(block["text"])
            if block.get("cache_control") is not None:
                marked = len(texts)
    return None if marked is None else "\n".join(texts[:marked])

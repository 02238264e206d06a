"""Prompt caches, as the simulator reports them, one per simulator (a deployment's own):

- Anthropic's: the system prompt up to its last `cache_control` mark is written to the cache
  the first time the simulator sees it and read from it after that, and the usage says so
  the way Anthropic's does (`input_tokens` counts only what was neither read nor written);
- OpenAI's, automatic: a prompt's longest run of leading messages seen before (under the
  same `prompt_cache_key`) is read from the cache, reported as `cached_tokens` once it is
  at least 1,024 tokens long, in steps of 128, as OpenAI's prompt caching does. Every
  leading run of a prompt answered is cached from then on.

Both are bounded: past `limit` entries, the oldest half goes."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import orjson

from ballast.sim.answer import Answer, content_text, count_words

MIN_CACHED = 1024  # OpenAI caches no prompt shorter than this
CACHE_STEP = 128  # and counts what it read in steps of this


class PromptCache:
    """The cached prefixes one simulator has seen."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: dict[bytes, None] = {}
        self._limit = limit

    def _cached(self, key: bytes) -> bool:
        """Whether `key` was cached already; it is from now on."""
        seen = self._seen
        if key in seen:
            return True
        if len(seen) >= self._limit:
            for old in list(seen)[: self._limit // 2]:
                del seen[old]
        seen[key] = None
        return False

    def usage(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, int]:
        """The usage's input fields for `body`, whose prompt is `prompt_tokens` long."""
        prefix = _marked_prefix(body)
        if prefix is None:
            return {"input_tokens": prompt_tokens}
        cached = min(count_words([prefix]), prompt_tokens)
        hit = self._cached(b"anthropic:" + hashlib.sha256(prefix.encode()).digest())
        return {
            "input_tokens": prompt_tokens - cached,
            "cache_creation_input_tokens": 0 if hit else cached,
            "cache_read_input_tokens": cached if hit else 0,
        }

    def reused(self, messages: list[Any], body: dict[str, Any], answer: Answer) -> Answer:
        """`answer` with the cached tokens of its prompt, `messages` (OpenAI's wires)."""
        key = body.get("prompt_cache_key")
        digest = hashlib.sha256(b"openai:" + (key if isinstance(key, str) else "").encode())
        words = cached = 0
        for message in messages:
            digest.update(orjson.dumps(message))
            if isinstance(message, dict):
                words += len(content_text(message.get("content")).split())
            if self._cached(digest.digest()):
                cached = words
        cached = min(cached, answer.prompt_tokens)
        if cached < MIN_CACHED:
            return answer
        return dataclasses.replace(answer, cached_tokens=cached - cached % CACHE_STEP)


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

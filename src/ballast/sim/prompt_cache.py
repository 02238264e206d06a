"""Prompt caches, as the simulator reports them, one per simulator (a deployment's own):

- Anthropic's and Bedrock's, marked: the prompt's text up to its last cache mark
  (Anthropic's `cache_control` on a system or message block, Bedrock's `cachePoint` block)
  is written to the cache the first time the simulator sees it and read from it after
  that, and the usage says so the way the provider's does (`input_tokens` counts only what
  was neither read nor written). Where the marks were is recorded too, so a test sees that
  each one reached the upstream where the client put it;
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

Blocks = list[tuple[str, str, bool]]  # (where, text, marked), in the prompt's order
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
        """Anthropic's usage input fields for `body`, whose prompt is `prompt_tokens` long."""
        split = self.split(prefix(anthropic_blocks(body)), prompt_tokens)
        if split is None:
            return {"input_tokens": prompt_tokens}
        read, written = split
        return {
            "input_tokens": prompt_tokens - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }

    def split(self, marked: str | None, prompt_tokens: int) -> tuple[int, int] | None:
        """(tokens read, tokens written) for a prompt whose marked prefix is `marked`; None
        when nothing is marked."""
        if marked is None:
            return None
        cached = min(count_words([marked]), prompt_tokens)
        if self._cached(b"marked:" + hashlib.sha256(marked.encode()).digest()):
            return cached, 0
        return 0, cached

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


def marks(blocks: Blocks) -> list[str]:
    """Where the prompt's cache marks are."""
    return [where for where, _, marked in blocks if marked]


def prefix(blocks: Blocks) -> str | None:
    """The prompt's text up to and with its last marked block."""
    last = max((i for i, (_, _, marked) in enumerate(blocks) if marked), default=None)
    if last is None:
        return None
    return "\n".join(text for _, text, _ in blocks[: last + 1] if text)


def anthropic_blocks(body: dict[str, Any]) -> Blocks:
    """A Messages body's tools, system blocks and message blocks, in order."""
    out: Blocks = []
    for i, tool in enumerate(_seq(body.get("tools"))):
        out.append((f"tools.{i}", "", _mark(tool)))
    for i, block in enumerate(_seq(body.get("system"))):
        out.append((f"system.{i}", _text(block), _mark(block)))
    for i, message in enumerate(_seq(body.get("messages"))):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            out.append((f"messages.{i}", content, False))
        for j, block in enumerate(_seq(content)):
            where = f"messages.{i}.content.{j}"
            out.append((where, _text(block), _mark(block)))
            inner = block.get("content") if isinstance(block, dict) else None
            for k, nested in enumerate(_seq(inner)):  # a tool result's own blocks
                out.append((f"{where}.content.{k}", "", _mark(nested)))
    return out


def converse_blocks(body: dict[str, Any]) -> Blocks:
    """A Converse body's tools, system blocks and message blocks, in order; a `cachePoint`
    block marks the place it stands."""
    out: Blocks = []
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    for i, tool in enumerate(_seq(tools)):
        out.append((f"toolConfig.tools.{i}", "", _point(tool)))
    for i, block in enumerate(_seq(body.get("system"))):
        out.append((f"system.{i}", _text(block), _point(block)))
    for i, message in enumerate(_seq(body.get("messages"))):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(_seq(content)):
            out.append((f"messages.{i}.content.{j}", _text(block), _point(block)))
    return out


def _seq(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(block: Any) -> str:
    text = block.get("text") if isinstance(block, dict) else None
    return text if isinstance(text, str) else ""


def _mark(block: Any) -> bool:
    return isinstance(block, dict) and block.get("cache_control") is not None


def _point(block: Any) -> bool:
    return isinstance(block, dict) and "cachePoint" in block

"""Prompt caches, as the simulator reports them, one per simulator (a deployment's own):

- Anthropic's and Bedrock's, marked: the prompt's text up to each cache mark (Anthropic's
  `cache_control` on a tool, system or message block, Bedrock's `cachePoint` block) is a
  prefix the cache can hold. The longest marked prefix seen before is read from the cache;
  what the later marks add is written to it, for as long as each mark asks (`"ttl": "1h"`,
  else 5 minutes). The usage says so the way the provider's does: `input_tokens` counts
  only what was neither read nor written, Anthropic's `cache_creation` splits the writes by
  how long they are kept. Where the marks were is recorded too, so a test sees that each
  one reached the upstream where the client put it. A behaviour's own cache figures
  (`cache_read`, `cache_write`, `cache_write_1h`) stand in for the marks when it gives any;
- OpenAI's, automatic: a prompt's longest run of leading messages seen before (under the
  same `prompt_cache_key`) is read from the cache, reported as `cached_tokens` once it is
  at least 1,024 tokens long, in steps of 128, as OpenAI's prompt caching does. Every
  leading run of a prompt answered is cached from then on.

Both are bounded: past `limit` entries, the oldest half goes."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

from ballast.sim.answer import Answer, content_text, count_words

Blocks = list[tuple[str, str, str | None]]  # (where, text, the mark's time to live), in order
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

    def usage(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        """Anthropic's usage input fields for `body`, answered with `answer`."""
        prompt = answer.prompt_tokens
        if answer.cached or answer.writes:
            return _fields(prompt, answer.cached, answer.written, answer.written_1h)
        split = self.split(prefixes(anthropic_blocks(body)), prompt)
        if split is None:
            return {"input_tokens": prompt}
        return _fields(prompt, *split)

    def split(
        self, marked: Sequence[tuple[str, str]], prompt_tokens: int
    ) -> tuple[int, int, int] | None:
        """(tokens read, written for 5 minutes, written for an hour) for a prompt whose
        marked prefixes are `marked` (shortest first, with their times to live); None when
        nothing is marked."""
        if not marked:
            return None
        read = short = long = counted = 0  # counted: the words of the prefixes before
        for text, ttl in marked:
            words = min(count_words([text]), prompt_tokens)
            if self._cached(b"marked:" + hashlib.sha256(text.encode()).digest()):
                read, short, long = words, 0, 0  # a longer hit replaces what came before
            elif ttl == "1h":
                long += words - counted
            else:
                short += words - counted
            counted = words
        return read, short, long

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
        return dataclasses.replace(answer, cached=cached - cached % CACHE_STEP)


def _fields(prompt: int, read: int, short: int, long: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt - read - short - long,
        "cache_creation_input_tokens": short + long,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": short, "ephemeral_1h_input_tokens": long},
    }


def marks(blocks: Blocks) -> list[str]:
    """Where the prompt's cache marks are."""
    return [where for where, _, ttl in blocks if ttl is not None]


def prefixes(blocks: Blocks) -> tuple[tuple[str, str], ...]:
    """The prompt's text up to and with each marked block, shortest first, with the mark's
    time to live."""
    out = []
    for i, (_, _, ttl) in enumerate(blocks):
        if ttl is not None:
            out.append(("\n".join(text for _, text, _ in blocks[: i + 1] if text), ttl))
    return tuple(out)


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
            out.append((f"messages.{i}", content, None))
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


def _mark(block: Any) -> str | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    return str(control.get("ttl") or "5m")


def _point(block: Any) -> str | None:
    return "5m" if isinstance(block, dict) and "cachePoint" in block else None

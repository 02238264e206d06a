"""Deterministic answers of the simulator.

The full answer of ``n`` tokens is ``"tok0 tok1 ... tok{n-1} "`` (token ``i`` is
``f"tok{i} "``). When the last chat message is an assistant *prefill* whose content is a
prefix of that full answer, the answer is only the remainder, so a client that continues
a broken stream on another upstream gets exactly the missing text.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ballast.sim.behaviour import Behaviour

EMBEDDING_DIM = 8


def token_text(i: int) -> str:
    """The text of token ``i``."""
    return f"tok{i} "


def full_tokens(tokens: int) -> list[str]:
    """The complete deterministic answer, one string per token."""
    return [token_text(i) for i in range(max(tokens, 0))]


def full_text(tokens: int) -> str:
    """The complete deterministic answer as one string."""
    return "".join(full_tokens(tokens))


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string, a list of parts, or null)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def count_words(texts: Iterable[str]) -> int:
    """Whitespace-separated words across ``texts``, at least 1."""
    return max(1, sum(len(text.split()) for text in texts))


def remainder_after(prefix: str, tokens: Sequence[str]) -> list[str] | None:
    """The tokens that follow ``prefix`` in ``tokens``, or None if it is not a prefix.

    A prefix that ends inside a token yields the rest of that token as the first piece.
    """
    joined = "".join(tokens)
    if not joined.startswith(prefix):
        return None
    consumed = 0
    for index, token in enumerate(tokens):
        end = consumed + len(token)
        if end > len(prefix):
            head = token[len(prefix) - consumed :] if len(prefix) > consumed else token
            return [head, *tokens[index + 1 :]]
        consumed = end
    return []


@dataclass(frozen=True, slots=True)
class Answer:
    """What the simulator will emit for one request."""

    pieces: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    prefill: bool
    continued: bool
    # Parts of the prompt the provider's cache read, wrote for 5 minutes, wrote for an hour;
    # tokens reasoned before answering (billed as output on top of the pieces).
    cached: int = 0
    written: int = 0
    written_1h: int = 0
    thinking: int = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        """The tokens the answer shows (its pieces)."""
        return len(self.pieces)

    @property
    def writes(self) -> int:
        """Prompt tokens written to the cache, for however long."""
        return self.written + self.written_1h

    def usage(self, emitted: int | None = None) -> dict[str, Any]:
        """The OpenAI ``usage`` object; ``emitted`` overrides the count of tokens shown.
        The cache's figures and the reasoning come as OpenAI reports them, when there are
        any (OpenAI does not say how long a write is kept)."""
        completion = (self.completion_tokens if emitted is None else emitted) + self.thinking
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        if self.cached or self.writes:
            details = {"cached_tokens": self.cached, "cache_write_tokens": self.writes}
            usage["prompt_tokens_details"] = details
        if self.thinking:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.thinking}
        return usage


def billed(answer: Answer, behaviour: Behaviour) -> Answer:
    """`answer` with what `behaviour` bills beyond what it shows: the prompt tokens its
    cache reads and writes (each at most what is left of the prompt) and hidden reasoning."""
    left = answer.prompt_tokens
    cached = min(behaviour.cache_read, left)
    written = min(behaviour.cache_write, left - cached)
    long = min(behaviour.cache_write_1h, left - cached - written)
    return replace(
        answer, cached=cached, written=written, written_1h=long, thinking=behaviour.thinking
    )


def _cap(pieces: list[str], max_tokens: int | None) -> tuple[list[str], str]:
    if max_tokens is not None and max_tokens < len(pieces):
        return pieces[:max_tokens], "length"
    return pieces, "stop"


def chat_answer(messages: Sequence[Any], tokens: int, max_tokens: int | None = None) -> Answer:
    """The answer to a chat request with ``messages`` (a list of message objects)."""
    texts = [content_text(m.get("content")) for m in messages if isinstance(m, dict)]
    prompt_tokens = count_words(texts)
    all_tokens = full_tokens(tokens)
    last = messages[-1] if messages else None
    prefill = isinstance(last, dict) and last.get("role") == "assistant"
    pieces: list[str] | None = None
    if prefill and isinstance(last, dict):
        pieces = remainder_after(content_text(last.get("content")), all_tokens)
    continued = pieces is not None
    capped, finish = _cap(all_tokens if pieces is None else pieces, max_tokens)
    return Answer(tuple(capped), finish, prompt_tokens, prefill, continued)


def prompt_texts(prompt: Any) -> list[str]:
    """The texts of a completions ``prompt`` (a string, a list of strings, or tokens)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p if isinstance(p, str) else str(p) for p in prompt]
    return []


def completion_answer(prompt: Any, tokens: int, max_tokens: int | None = None) -> Answer:
    """The answer to a legacy completions request."""
    capped, finish = _cap(full_tokens(tokens), max_tokens)
    return Answer(tuple(capped), finish, count_words(prompt_texts(prompt)), False, False)


def embedding(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector of ``dim`` floats derived from ``text``."""
    raw = b""
    counter = 0
    while len(raw) < dim * 4:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [(int.from_bytes(raw[i * 4 : i * 4 + 4], "big") / 2**32) * 2 - 1 for i in range(dim)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in values]


def embedding_base64(vector: Sequence[float]) -> str:
    """``vector`` as little-endian float32, base64-encoded (``encoding_format=base64``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def wants_json(body: dict[str, Any]) -> bool:
    """The request asks for JSON output (chat's `response_format`, Responses' `text.format`)."""
    given = body.get("response_format")
    text = body.get("text")
    if given is None and isinstance(text, dict):
        given = text.get("format")  # the Responses wire's place for it
    return isinstance(given, dict) and given.get("type") in ("json_schema", "json_object")


def tool_result_last(body: dict[str, Any]) -> bool:
    """The conversation ends with a tool's result: a tool-calling model answers in text."""
    for key in ("messages", "input"):
        given = body.get(key)
        if isinstance(given, list) and given and isinstance(given[-1], dict):
            last = given[-1]
            return last.get("role") == "tool" or last.get("type") == "function_call_output"
    return False

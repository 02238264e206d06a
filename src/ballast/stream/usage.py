"""What an answer's usage says, read once from whichever of the three shapes it came in: chat
(`prompt_tokens`, a native adapter's translation included), Responses (`input_tokens` with
`input_tokens_details`) or Anthropic's Messages (`input_tokens` apart from the cache's
`cache_read_input_tokens` and `cache_creation_input_tokens`). Spend, budgets, rate limits,
metrics, the request log and the shape translators all read the one `Usage` made here, so a
figure cannot mean one thing to the bill and another to the client.

Every count is what the provider bills: `prompt` holds every input token (those read from the
cache and those written to it too), `completion` every output token (reasoning too: OpenAI,
Anthropic and Gemini bill it as output). `cached`, `written`, `written_1h` and `reasoning`
are parts of those, never added on top."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

MAX_TOKEN_COUNT = 2**31 - 1  # the spend table's INTEGER columns (PostgreSQL's int4)


class Usage(NamedTuple):
    """One answer's tokens, as billed (a tuple: made for every answered request)."""

    prompt: int = 0  # every input token, the cache's reads and writes included
    completion: int = 0  # every output token, reasoning included
    cached: int = 0  # input tokens read from the provider's prompt cache
    written: int = 0  # input tokens written to it (for 5 minutes or for an hour)
    written_1h: int = 0  # of `written`, those kept for an hour (Anthropic's dearer write)
    reasoning: int = 0  # of `completion`, the tokens the model reasoned with


NO_USAGE = Usage()


def read(usage: Any) -> Usage:
    """`usage` in any of the three shapes as a `Usage`. Anything that is not a sane count is
    0, and counts are capped at what the spend table stores: an upstream's garbage must not
    fail an answered request, nor a spend batch (and its replays) for good."""
    if not isinstance(usage, dict):
        return NO_USAGE
    if "input_tokens" not in usage:  # chat, the common case
        details = usage.get("prompt_tokens_details")
        if details is None and (
            "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage
        ):  # a chat usage with Anthropic's names for the cache (LiteLLM's)
            details = {
                "cached_tokens": usage.get("cache_read_input_tokens"),
                "cache_write_tokens": usage.get("cache_creation_input_tokens"),
            }
        output = usage.get("completion_tokens_details")
        return _parts(
            count(usage.get("prompt_tokens")),
            count(usage.get("completion_tokens")),
            details,
            output.get("reasoning_tokens") if isinstance(output, dict) else None,
        )
    prompt = count(usage.get("input_tokens"))
    completion = count(usage.get("output_tokens"))
    output = usage.get("output_tokens_details")
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        return _anthropic(usage, prompt, completion, output)
    # Responses (or a Messages answer that used no cache: the two then read the same).
    thought = None
    if isinstance(output, dict):
        thought = output.get("reasoning_tokens", output.get("thinking_tokens"))
    return _parts(prompt, completion, usage.get("input_tokens_details"), thought)


def _parts(prompt: int, completion: int, details: Any, thought: Any) -> Usage:
    """An OpenAI-shaped usage's parts: `cached_tokens`, `cache_write_tokens` (every write,
    as OpenAI's own field counts them) and Ballast's `cache_write_1h_tokens` (of those, the
    hour-long ones a translated Anthropic answer reports)."""
    if not isinstance(details, dict):
        return Usage(prompt, completion, 0, 0, 0, _within(count(thought), completion))
    cached = _within(count(details.get("cached_tokens")), prompt)
    written = _within(count(details.get("cache_write_tokens")), prompt - cached)
    long = _within(count(details.get("cache_write_1h_tokens")), written)
    return Usage(prompt, completion, cached, written, long, _within(count(thought), completion))


def _anthropic(usage: dict[str, Any], fresh: int, completion: int, output: Any) -> Usage:
    """Anthropic's usage: `input_tokens` counts only what was neither read from the cache nor
    written to it; `cache_creation` splits the writes by how long they are kept."""
    cached = count(usage.get("cache_read_input_tokens"))
    written = count(usage.get("cache_creation_input_tokens"))
    split = usage.get("cache_creation")
    long = 0
    if isinstance(split, dict):
        long = _within(count(split.get("ephemeral_1h_input_tokens")), written)
    thought = output.get("thinking_tokens") if isinstance(output, dict) else None
    prompt = min(fresh + cached + written, MAX_TOKEN_COUNT)
    return Usage(prompt, completion, cached, written, long, _within(count(thought), completion))


def _within(part: int, whole: int) -> int:
    return part if part < whole else whole if whole > 0 else 0


def count(value: Any) -> int:
    """A token count as the spend table keeps it: a non-negative int, at most int4's top."""
    if type(value) is int:  # not a bool
        return (value if value < MAX_TOKEN_COUNT else MAX_TOKEN_COUNT) if value > 0 else 0
    if type(value) is float and value > 0 and math.isfinite(value):
        return int(min(value, MAX_TOKEN_COUNT))
    return 0


def chat_usage(usage: Usage) -> dict[str, Any]:
    """`usage` in chat's shape: the figures OpenAI names (`cached_tokens`,
    `cache_write_tokens`, `reasoning_tokens`) where they are not zero, and the hour-long
    writes as `cache_write_1h_tokens` (a part of `cache_write_tokens`)."""
    prompt, completion, cached, written, long, reasoning = usage
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached or written:
        details = {"cached_tokens": cached}
        if written:
            details["cache_write_tokens"] = written
            details["cache_write_1h_tokens"] = long
        out["prompt_tokens_details"] = details
    if reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out

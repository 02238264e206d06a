"""The simulator's prompt cache: a marked system prompt is written once, then read, and the
usage splits the input the way Anthropic's does."""

from __future__ import annotations

from typing import Any

from ballast.sim.prompt_cache import PromptCache


def test_a_marked_prefix_is_written_then_read() -> None:
    cache = PromptCache()
    marked = {"type": "text", "text": "a b c", "cache_control": {"type": "ephemeral"}}
    body: Any = {"system": [marked, {"type": "text", "text": "d e"}]}
    assert cache.usage(body, 10) == {
        "input_tokens": 7,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 0,
    }
    assert cache.usage(body, 10) == {
        "input_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3,
    }
    assert cache.usage({"system": "no marks"}, 10) == {"input_tokens": 10}

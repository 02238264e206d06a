"""The simulator's prompt caches: the prompt up to its last mark (a marked system or message
block, a Converse cachePoint) is written once, then read, and the usage splits the input the
way the provider's does; where the marks are is found."""

from __future__ import annotations

from typing import Any

from ballast.sim.prompt_cache import PromptCache, anthropic_blocks, converse_blocks, marks, prefix


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


def test_a_mark_on_a_message_block_caches_the_prompt_up_to_it_and_marks_are_found() -> None:
    mark = {"type": "ephemeral"}
    body: Any = {
        "tools": [{"name": "f", "cache_control": mark}],
        "system": [{"type": "text", "text": "a b"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "c d e", "cache_control": mark}]},
            {"role": "user", "content": "f"},
        ],
    }
    cache = PromptCache()
    assert cache.usage(body, 6)["cache_creation_input_tokens"] == 5
    assert cache.usage(body, 6) == {
        "input_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 5,
    }
    assert marks(anthropic_blocks(body)) == ["tools.0", "messages.0.content.0"]
    point = {"cachePoint": {"type": "default"}}
    converse: Any = {
        "system": [{"text": "a b"}, point],
        "messages": [{"role": "user", "content": [{"text": "c"}, point, {"text": "d"}]}],
    }
    blocks = converse_blocks(converse)
    assert marks(blocks) == ["system.1", "messages.0.content.1"]
    assert prefix(blocks) == "a b\nc"
    assert cache.split(prefix(blocks), 4) == (0, 3)
    assert cache.split(prefix(blocks), 4) == (3, 0)
    assert cache.split(None, 4) is None

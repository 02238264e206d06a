"""The simulator's prompt caches: the marked ones (the prompt up to its last mark, a marked
system or message block or a Converse cachePoint, is written once, then read, and the usage
splits the input the way the provider's does; where the marks are is found) and OpenAI's
automatic one (the longest leading run of messages seen before, from 1,024 tokens, in steps
of 128)."""

from __future__ import annotations

from typing import Any

from ballast.sim.answer import Answer, chat_answer
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


def chat(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "system" if i == 0 else "user", "content": t} for i, t in enumerate(texts)]


def answer(prompt: list[dict[str, Any]]) -> Answer:
    return chat_answer(prompt, 3)


def test_openai_reads_the_longest_leading_run_seen_before_in_steps_of_128() -> None:
    cache = PromptCache()
    first = chat("rule " * 1100, "question one")
    assert cache.reused(first, {}, answer(first)).cached_tokens == 0  # written, not read
    again = cache.reused(first, {}, answer(first))
    assert again.cached_tokens == 1024  # 1,102 words seen: read in steps of 128
    assert again.usage()["prompt_tokens_details"] == {"cached_tokens": 1024}
    longer = [*first, {"role": "assistant", "content": "tok0 " * 200}, *chat("x", "two")[1:]]
    assert cache.reused(longer, {}, answer(longer)).cached_tokens == 1024  # the first two
    assert cache.reused(longer, {}, answer(longer)).cached_tokens == 1280  # all 1,303
    other = chat("rule " * 1100, "question two")
    assert cache.reused(other, {}, answer(other)).cached_tokens == 1024  # the system prompt


def test_openai_caches_nothing_short_and_keeps_prompt_cache_keys_apart() -> None:
    cache = PromptCache()
    short = chat("rule " * 500, "q")
    cache.reused(short, {}, answer(short))
    assert cache.reused(short, {}, answer(short)).cached_tokens == 0
    assert "prompt_tokens_details" not in answer(short).usage()
    long = chat("rule " * 1100, "q")
    cache.reused(long, {"prompt_cache_key": "one"}, answer(long))
    assert cache.reused(long, {"prompt_cache_key": "two"}, answer(long)).cached_tokens == 0
    assert cache.reused(long, {"prompt_cache_key": "one"}, answer(long)).cached_tokens == 1024


def test_the_cache_is_bounded() -> None:
    cache = PromptCache(limit=4)
    prompts = [chat("rule " * 1100, f"q{i}") for i in range(4)]
    for prompt in prompts:
        cache.reused(prompt, {}, answer(prompt))  # 5 leading runs: the oldest half went
    assert len(cache._seen) <= 4

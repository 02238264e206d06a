"""The simulator's prompt caches. The marked ones (a marked tool, system or message block, or
a Converse cachePoint): a prefix is written once, then read, and the usage splits the input
the way the provider's does; a longer prompt reads the part it shares and writes the rest,
each mark for as long as it asks; where the marks are is found; a behaviour's own figures
win. OpenAI's automatic one: the longest leading run of messages seen before, from 1,024
tokens, in steps of 128."""

from __future__ import annotations

from typing import Any

from ballast.sim.answer import Answer, billed, chat_answer
from ballast.sim.behaviour import parse_behaviour
from ballast.sim.prompt_cache import (
    PromptCache,
    anthropic_blocks,
    converse_blocks,
    marks,
    prefixes,
)


def _answer(prompt: int) -> Answer:
    return Answer(("tok0 ",), "stop", prompt, False, False)


def _usage(read: int, short: int, long: int, fresh: int) -> dict[str, Any]:
    return {
        "input_tokens": fresh,
        "cache_creation_input_tokens": short + long,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": short, "ephemeral_1h_input_tokens": long},
    }


def test_a_marked_prefix_is_written_then_read() -> None:
    cache = PromptCache()
    marked = {"type": "text", "text": "a b c", "cache_control": {"type": "ephemeral"}}
    body: Any = {"system": [marked, {"type": "text", "text": "d e"}]}
    assert cache.usage(body, _answer(10)) == _usage(0, 3, 0, 7)
    assert cache.usage(body, _answer(10)) == _usage(3, 0, 0, 7)
    assert cache.usage({"system": "no marks"}, _answer(10)) == {"input_tokens": 10}


def test_a_longer_prompt_reads_what_it_shares_and_writes_the_rest_for_an_hour() -> None:
    cache = PromptCache()
    hour = {"type": "ephemeral", "ttl": "1h"}
    first = {"type": "text", "text": "a b c d", "cache_control": hour}
    second = {"type": "text", "text": "e f", "cache_control": {"type": "ephemeral"}}
    third = {"type": "text", "text": "g h i", "cache_control": hour}
    assert cache.usage({"system": [first]}, _answer(20)) == _usage(0, 0, 4, 16)
    # The first mark is a hit; what the second adds is kept 5 minutes, the third's an hour.
    assert cache.usage({"system": [first, second, third]}, _answer(20)) == _usage(4, 2, 3, 11)
    assert cache.usage({"system": [first, second, third]}, _answer(20)) == _usage(9, 0, 0, 11)


def test_a_behaviours_figures_stand_in_for_the_marks() -> None:
    spec = "ok?cache_read=5&cache_write=4&cache_write_1h=3&thinking=2"
    answer = billed(_answer(10), parse_behaviour(spec))
    # At most what is left of the prompt, in order: 5 read, 4 written, 1 (not 3) for an hour.
    assert (answer.cached, answer.written, answer.written_1h, answer.thinking) == (5, 4, 1, 2)
    marked = {"type": "text", "text": "a b", "cache_control": {"type": "ephemeral"}}
    assert PromptCache().usage({"system": [marked]}, answer) == _usage(5, 4, 1, 0)


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
    assert cache.usage(body, _answer(6))["cache_creation_input_tokens"] == 5
    assert cache.usage(body, _answer(6)) == _usage(5, 0, 0, 1)
    assert marks(anthropic_blocks(body)) == ["tools.0", "messages.0.content.0"]
    point = {"cachePoint": {"type": "default"}}
    converse: Any = {
        "system": [{"text": "a b"}, point],
        "messages": [{"role": "user", "content": [{"text": "c"}, point, {"text": "d"}]}],
    }
    blocks = converse_blocks(converse)
    assert marks(blocks) == ["system.1", "messages.0.content.1"]
    assert prefixes(blocks) == (("a b", "5m"), ("a b\nc", "5m"))
    assert cache.split(prefixes(blocks), 4) == (0, 3, 0)
    assert cache.split(prefixes(blocks), 4) == (3, 0, 0)
    assert cache.split((), 4) is None


def chat(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "system" if i == 0 else "user", "content": t} for i, t in enumerate(texts)]


def answer(prompt: list[dict[str, Any]]) -> Answer:
    return chat_answer(prompt, 3)


def test_openai_reads_the_longest_leading_run_seen_before_in_steps_of_128() -> None:
    cache = PromptCache()
    first = chat("rule " * 1100, "question one")
    assert cache.reused(first, {}, answer(first)).cached == 0  # written, not read
    again = cache.reused(first, {}, answer(first))
    assert again.cached == 1024  # 1,102 words seen: read in steps of 128
    assert again.usage()["prompt_tokens_details"] == {
        "cached_tokens": 1024,
        "cache_write_tokens": 0,
    }
    longer = [*first, {"role": "assistant", "content": "tok0 " * 200}, *chat("x", "two")[1:]]
    assert cache.reused(longer, {}, answer(longer)).cached == 1024  # the first two
    assert cache.reused(longer, {}, answer(longer)).cached == 1280  # all 1,303
    other = chat("rule " * 1100, "question two")
    assert cache.reused(other, {}, answer(other)).cached == 1024  # the system prompt


def test_openai_caches_nothing_short_and_keeps_prompt_cache_keys_apart() -> None:
    cache = PromptCache()
    short = chat("rule " * 500, "q")
    cache.reused(short, {}, answer(short))
    assert cache.reused(short, {}, answer(short)).cached == 0
    assert "prompt_tokens_details" not in answer(short).usage()
    long = chat("rule " * 1100, "q")
    cache.reused(long, {"prompt_cache_key": "one"}, answer(long))
    assert cache.reused(long, {"prompt_cache_key": "two"}, answer(long)).cached == 0
    assert cache.reused(long, {"prompt_cache_key": "one"}, answer(long)).cached == 1024


def test_the_cache_is_bounded() -> None:
    cache = PromptCache(limit=4)
    prompts = [chat("rule " * 1100, f"q{i}") for i in range(4)]
    for prompt in prompts:
        cache.reused(prompt, {}, answer(prompt))  # 5 leading runs: the oldest half went
    assert len(cache._seen) <= 4

"""The simulator's prompt cache: a marked system prompt is written once, then read, and the
usage splits the input the way Anthropic's does: a longer prompt reads the part it shares
and writes the rest, each mark for as long as it asks; a behaviour's own figures win."""

from __future__ import annotations

from typing import Any

from ballast.sim.answer import Answer, billed
from ballast.sim.behaviour import parse_behaviour
from ballast.sim.prompt_cache import PromptCache


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

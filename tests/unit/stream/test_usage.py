"""One reader of usage for every shape it comes in: the same answer reads the same in chat's,
Responses' and Anthropic's words, its parts never add to the whole, garbage is zero, and
chat's own shape written back reads as it was."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.stream.usage import MAX_TOKEN_COUNT, NO_USAGE, Usage, chat_usage, read

# 1,000 prompt tokens (100 read from the cache, 300 written to it, 100 of those for an
# hour) and 50 completion tokens (20 of them reasoning), in each shape's words.
SAME = Usage(1000, 50, 100, 300, 100, 20)
SHAPES: dict[str, dict[str, Any]] = {
    "chat": {
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "total_tokens": 1050,
        "prompt_tokens_details": {
            "cached_tokens": 100,
            "cache_write_tokens": 300,
            "cache_write_1h_tokens": 100,
        },
        "completion_tokens_details": {"reasoning_tokens": 20},
    },
    "responses": {
        "input_tokens": 1000,
        "input_tokens_details": {
            "cached_tokens": 100,
            "cache_write_tokens": 300,
            "cache_write_1h_tokens": 100,
        },
        "output_tokens": 50,
        "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 1050,
    },
    "anthropic": {
        "input_tokens": 600,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 300,
        "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 100},
        "output_tokens": 50,
        "output_tokens_details": {"thinking_tokens": 20},
    },
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_reads_the_same(shape: str) -> None:
    assert read(SHAPES[shape]) == SAME


def test_chat_usage_written_back_reads_as_it_was() -> None:
    assert chat_usage(SAME) == SHAPES["chat"]
    assert read(chat_usage(SAME)) == SAME
    # Nothing the cache did, no reasoning: the three fields OpenAI always sends, no more.
    plain = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert chat_usage(Usage(3, 4)) == plain


def test_anthropic_without_the_split_writes_for_five_minutes() -> None:
    usage = {"input_tokens": 5, "cache_creation_input_tokens": 7, "output_tokens": 1}
    assert read(usage) == Usage(12, 1, 0, 7, 0)
    # An answer that used no cache reads the same in Anthropic's and Responses' words.
    plain = {"input_tokens": 5, "output_tokens": 2, "output_tokens_details": {"thinking_tokens": 1}}
    assert read(plain) == Usage(5, 2, reasoning=1)


def test_a_chat_usage_in_anthropic_words_for_the_cache_is_read() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 1,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 20,
    }
    assert read(usage) == Usage(100, 1, 30, 20)


def test_parts_never_exceed_their_whole() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "prompt_tokens_details": {
            "cached_tokens": 8,
            "cache_write_tokens": 9,
            "cache_write_1h_tokens": 9,
        },
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    assert read(usage) == Usage(10, 3, 8, 2, 2, 3)
    split = {"ephemeral_1h_input_tokens": 50}
    anthropic = {"input_tokens": 1, "cache_creation_input_tokens": 4, "cache_creation": split}
    assert read(anthropic) == Usage(5, 0, 0, 4, 4)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 5}, (12, 5)),
        ({"prompt_tokens": 12.0, "completion_tokens": None}, (12, 0)),
        ({"prompt_tokens": "12", "completion_tokens": "many"}, (0, 0)),
        ({"prompt_tokens": -3, "completion_tokens": True}, (0, 0)),
        ({"prompt_tokens": float("inf"), "completion_tokens": float("nan")}, (0, 0)),
        ({"prompt_tokens": [1], "completion_tokens": {"n": 1}}, (0, 0)),
        (
            {"prompt_tokens": 10**30, "completion_tokens": 1e300},
            (MAX_TOKEN_COUNT, MAX_TOKEN_COUNT),
        ),
        ({"input_tokens": 2**31, "cache_read_input_tokens": 2**31}, (MAX_TOKEN_COUNT, 0)),
        ({}, (0, 0)),
        ("usage", (0, 0)),
        (None, (0, 0)),
    ],
)
def test_counts_are_only_sane_numbers(usage: Any, expected: tuple[int, int]) -> None:
    counts = read(usage)
    assert counts[:2] == expected
    assert all(type(n) is int and 0 <= n <= MAX_TOKEN_COUNT for n in counts)


def test_garbage_in_the_details_is_none() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": "cached",
        "completion_tokens_details": [1],
    }
    assert read(usage) == Usage(10, 2)
    assert read({"input_tokens": 3, "cache_read_input_tokens": "x", "cache_creation": 7}) == (
        Usage(3, 0)
    )
    assert read(None) is NO_USAGE

"""What a stream cut short is billed: the upstream's own count, raised to the output that
was relayed when the count came early (Anthropic's arrives with the first event)."""

from __future__ import annotations

from ballast.pipeline.relay import at_least


def test_an_early_output_count_is_raised_to_what_was_relayed() -> None:
    early = {"input_tokens": 5, "cache_read_input_tokens": 40, "output_tokens": 1}
    assert at_least(early, 30) == {**early, "output_tokens": 30}
    chat = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert at_least(chat, 10) == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}


def test_a_count_that_already_covers_the_relayed_output_stands() -> None:
    assert at_least({"output_tokens": 40}, 30) is None
    assert at_least({"input_tokens": 3}, 30) is None  # no output count to raise

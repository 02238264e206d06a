"""Behaviour specs, deterministic answers and rule state of the simulator (no network)."""

from __future__ import annotations

import base64
import random
import struct
import time

import pytest

from ballast.sim.answer import (
    chat_answer,
    completion_answer,
    embedding,
    embedding_base64,
    full_text,
    remainder_after,
)
from ballast.sim.behaviour import BEHAVIOUR_NAMES, parse_behaviour
from ballast.sim.bodies import fault_error, format_retry_after
from ballast.sim.state import WILDCARD, Rule, SimState, mask_secret

# -- parsing -------------------------------------------------------------------------------


def test_every_documented_name_parses() -> None:
    expected = {
        "ok", "429", "500", "503", "reset", "hang", "slow_first", "cut", "stall",
        "malformed", "no_done", "error_event", "context_length", "content_filter", "409", "401",
        "html", "gzip_truncated", "wrong_type", "bad_crc", "expired_token",
    }  # fmt: skip
    assert set(BEHAVIOUR_NAMES) == expected
    for name in expected:
        assert parse_behaviour(name).name == name


def test_ok_defaults_and_params() -> None:
    ok = parse_behaviour("ok")
    assert (ok.tokens, ok.delay, ok.first_token_delay, ok.latency) == (16, 0.0, 0.0, 0.0)
    custom = parse_behaviour("ok?tokens=4&delay=0.05&first_token_delay=0.2&latency=1.5")
    assert custom.tokens == 4
    assert custom.delay == pytest.approx(0.05)
    assert custom.first_token_delay == pytest.approx(0.2)
    assert custom.latency == pytest.approx(1.5)
    assert custom.spec == "ok?tokens=4&delay=0.05&first_token_delay=0.2&latency=1.5"
    agent = parse_behaviour("ok?shape=agent&tool=echo&arg=hi&calls=2")
    assert (agent.shape, agent.tool, agent.arg, agent.calls) == ("agent", "echo", "hi", 2)
    assert ok.calls == 1


def test_error_mode_params() -> None:
    assert parse_behaviour("429").retry_after is None
    assert parse_behaviour("429?retry_after=2").retry_after == 2.0
    assert parse_behaviour("500").mode == "always"
    assert parse_behaviour("503?mode=once").mode == "once"
    flap = parse_behaviour("500?mode=flap&seconds=0.5")
    assert (flap.mode, flap.seconds) == ("flap", 0.5)
    rnd = parse_behaviour("503?mode=random&p=0.25&seed=7")
    assert (rnd.mode, rnd.p, rnd.seed) == ("random", 0.25, 7)
    assert rnd.is_error_mode and not parse_behaviour("409").is_error_mode


def test_fault_params_and_defaults() -> None:
    assert parse_behaviour("cut?after=3").after == 3
    stall = parse_behaviour("stall?after=1")
    assert (stall.after, stall.seconds) == (1, 3600.0)
    assert parse_behaviour("stall?seconds=0.3").seconds == pytest.approx(0.3)
    assert parse_behaviour("malformed?at=4").at == 4
    # slow_first's ``delay`` is the wait before headers and the first token.
    slow = parse_behaviour("slow_first?delay=1.5")
    assert (slow.first_token_delay, slow.delay) == (1.5, 0.0)
    assert parse_behaviour("409").code == "conflict"
    assert parse_behaviour("409?code=sampling_run_inactive").code == "sampling_run_inactive"
    assert parse_behaviour("content_filter?reason=violence").reason == "violence"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty"),
        ("teapot", "unknown behaviour 'teapot'"),
        ("ok?colour=red", "does not accept parameter 'colour'"),
        ("reset?after=1", "does not accept parameter 'after'"),
        ("ok?tokens=many", "'tokens' must be an integer"),
        ("ok?tokens=-1", "'tokens' must be >= 0"),
        ("ok?shape=agent&calls=0", "'calls' must be >= 1"),
        ("ok?delay=-0.5", "'delay' must be a finite number >= 0"),
        ("ok?delay=nan", "'delay' must be a finite number >= 0"),
        ("500?mode=sometimes", "'mode' must be one of"),
        ("500?mode=random&p=1.5", "'p' must be between 0 and 1"),
        ("ok?tokens=1&tokens=2", "given twice"),
        ("409?code=", "'code' must not be empty"),
        ("ok?tokens", "malformed parameters"),
    ],
)
def test_invalid_specs_raise_clear_value_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_behaviour(spec)
    assert fragment in str(info.value)


# -- answers -------------------------------------------------------------------------------


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_full_answer_and_usage() -> None:
    assert full_text(4) == "tok0 tok1 tok2 tok3 "
    answer = chat_answer([{"role": "system", "content": "be brief"}, _user("say hi now")], 4)
    assert answer.text == "tok0 tok1 tok2 tok3 "
    assert answer.finish_reason == "stop"
    assert not answer.prefill and not answer.continued
    assert answer.usage() == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_prompt_tokens_are_at_least_one_and_read_content_parts() -> None:
    assert chat_answer([_user("")], 1).prompt_tokens == 1
    parts = [{"type": "text", "text": "one two"}, {"type": "text", "text": " three"}]
    assert chat_answer([{"role": "user", "content": parts}], 1).prompt_tokens == 3


def test_max_tokens_caps_with_length_finish() -> None:
    answer = chat_answer([_user("x")], 10, max_tokens=3)
    assert answer.pieces == ("tok0 ", "tok1 ", "tok2 ")
    assert answer.finish_reason == "length"
    assert chat_answer([_user("x")], 3, max_tokens=3).finish_reason == "stop"


def test_prefill_prefix_yields_only_the_remainder() -> None:
    messages = [_user("go"), {"role": "assistant", "content": "tok0 tok1 "}]
    answer = chat_answer(messages, 4)
    assert answer.prefill and answer.continued
    assert answer.text == "tok2 tok3 "
    assert answer.completion_tokens == 2
    # the assistant's words count as prompt
    assert answer.prompt_tokens == 3


def test_prefill_ending_inside_a_token_continues_mid_token() -> None:
    messages = [_user("go"), {"role": "assistant", "content": "tok0 to"}]
    answer = chat_answer(messages, 3)
    assert answer.pieces == ("k1 ", "tok2 ")
    assert "tok0 to" + answer.text == full_text(3)


def test_prefill_that_is_not_a_prefix_answers_in_full() -> None:
    messages = [_user("go"), {"role": "assistant", "content": "hello"}]
    answer = chat_answer(messages, 3)
    assert answer.prefill and not answer.continued
    assert answer.text == full_text(3)


def test_prefill_of_the_whole_answer_leaves_nothing() -> None:
    answer = chat_answer([_user("go"), {"role": "assistant", "content": full_text(3)}], 3)
    assert answer.pieces == ()
    assert answer.finish_reason == "stop"


def test_prefill_remainder_is_capped_by_max_tokens() -> None:
    messages = [_user("go"), {"role": "assistant", "content": "tok0 "}]
    answer = chat_answer(messages, 5, max_tokens=2)
    assert answer.text == "tok1 tok2 "
    assert answer.finish_reason == "length"


def test_remainder_after() -> None:
    tokens = ["tok0 ", "tok1 "]
    assert remainder_after("", tokens) == tokens
    assert remainder_after("tok0 ", tokens) == ["tok1 "]
    assert remainder_after("tok1 ", tokens) is None


def test_completion_answer_counts_prompt_words() -> None:
    answer = completion_answer(["a b", "c"], 2)
    assert answer.text == "tok0 tok1 "
    assert answer.prompt_tokens == 3


def test_embeddings_are_deterministic_unit_vectors() -> None:
    first = embedding("hello")
    assert len(first) == 8
    assert first == embedding("hello")
    assert first != embedding("hullo")
    assert sum(v * v for v in first) == pytest.approx(1.0, abs=1e-4)
    decoded = struct.unpack("<8f", base64.b64decode(embedding_base64(first)))
    assert list(decoded) == pytest.approx(first, abs=1e-6)


# -- error bodies --------------------------------------------------------------------------


def test_fault_error_bodies() -> None:
    status, body, headers = fault_error(parse_behaviour("429?retry_after=2"), 1, None)
    assert (status, headers["Retry-After"], headers["retry-after-ms"]) == (429, "2", "2000")
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert fault_error(parse_behaviour("429"), 1, None)[2] == {}
    status, body, _ = fault_error(parse_behaviour("context_length"), 1, None)
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    assert body["error"]["type"] == "invalid_request_error"
    status, body, _ = fault_error(parse_behaviour("content_filter"), 1, None)
    assert (status, body["error"]["code"]) == (400, "content_filter")
    assert "(sim: hate)" in body["error"]["message"]
    status, body, _ = fault_error(parse_behaviour("409?code=sampling_run_inactive"), 1, None)
    assert (status, body["error"]["code"]) == (409, "sampling_run_inactive")
    status, body, _ = fault_error(parse_behaviour("401"), 1, "Bearer sk-secret-9876")
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert "sk-secret" not in body["error"]["message"] and "9876" in body["error"]["message"]
    with pytest.raises(ValueError):
        fault_error(parse_behaviour("ok"), 1, None)


def test_format_retry_after() -> None:
    assert format_retry_after(3.0) == "3"
    assert format_retry_after(0.5) == "0.5"


def test_mask_secret_keeps_last_four() -> None:
    assert mask_secret("Bearer sk-abcdef1234") == "***1234"


# -- rule state ----------------------------------------------------------------------------


def test_once_fails_first_request_per_model() -> None:
    rule = Rule(parse_behaviour("500?mode=once"))
    assert [rule.should_fail("a"), rule.should_fail("a"), rule.should_fail("b")] == [
        True,
        False,
        True,
    ]


def test_flap_fails_only_inside_its_window() -> None:
    rule = Rule(parse_behaviour("503?mode=flap&seconds=0.05"))
    assert rule.should_fail("a")
    time.sleep(0.08)
    assert not rule.should_fail("a")


def test_random_with_seed_is_reproducible() -> None:
    spec = "500?mode=random&p=0.5&seed=42"
    rule_a, rule_b = Rule(parse_behaviour(spec)), Rule(parse_behaviour(spec))
    seq_a = [rule_a.should_fail("m") for _ in range(30)]
    seq_b = [rule_b.should_fail("m") for _ in range(30)]
    assert seq_a == seq_b
    rng = random.Random(42)
    assert seq_a == [rng.random() < 0.5 for _ in range(30)]
    assert True in seq_a and False in seq_a


def test_selection_order_and_reset_of_state() -> None:
    state = SimState("ok", "s", ("m",))
    assert state.select("a", None).behaviour.name == "ok"
    state.set_rule(WILDCARD, "503")
    state.set_rule("a", "500?mode=once")
    assert state.select("a", None).behaviour.name == "500"
    assert state.select("b", None).behaviour.name == "503"
    assert state.select("a", "429").behaviour.name == "429"
    assert state.select("a", None).should_fail("a")
    assert not state.select("a", None).should_fail("a")
    state.set_rule("a", "500?mode=once")  # setting again resets the once state
    assert state.select("a", None).should_fail("a")
    assert state.clear_rules() == 2
    assert state.select("a", None).behaviour.name == "ok"
    with pytest.raises(ValueError):
        state.select("a", "nope")

"""The one backoff formula: exponential, capped, jittered by as much as its caller asks."""

from __future__ import annotations

import random

import pytest

from ballast.resilience.backoff import Backoff


def test_full_jitter_spreads_waits_under_an_exponential_bound() -> None:
    rng = random.Random(5)
    backoff = Backoff(base=0.1, cap=2.0)
    for attempt, upper in ((0, 0.1), (1, 0.2), (3, 0.8), (10, 2.0)):
        samples = [backoff.delay(attempt, rng) for _ in range(400)]
        assert all(0.0 <= s <= upper for s in samples)
        assert max(samples) > 0.9 * upper and min(samples) < 0.1 * upper


def test_a_huge_or_negative_attempt_stays_within_cap_and_base() -> None:
    rng = random.Random(1)
    assert 0.0 <= Backoff(0.1, 3.0).delay(10_000, rng) <= 3.0
    assert Backoff(0.1, 3.0, factor=1.5).ceiling(100_000) == 3.0
    assert 0.0 <= Backoff(0.1, 3.0).delay(-4, rng) <= 0.1


def test_partial_jitter_keeps_a_floor_under_the_wait() -> None:
    rng = random.Random(2)
    backoff = Backoff(base=1.0, cap=8.0, jitter=0.5)
    for attempt, ceiling in ((1, 2.0), (2, 4.0), (3, 8.0), (6, 8.0)):
        samples = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(0.5 * ceiling <= s <= ceiling for s in samples)
        assert max(samples) > 0.95 * ceiling and min(samples) < 0.55 * ceiling


def test_without_jitter_the_wait_is_the_ceiling_and_needs_no_random_source() -> None:
    backoff = Backoff(base=1.0, cap=8.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_the_growth_factor_is_a_parameter() -> None:
    backoff = Backoff(base=5.0, cap=30.0, factor=1.5, jitter=0.2)
    assert [backoff.ceiling(n) for n in range(6)] == [5.0, 7.5, 11.25, 16.875, 25.3125, 30.0]
    rng = random.Random(3)
    assert all(4.0 <= backoff.delay(0, rng) <= 5.0 for _ in range(100))


def test_a_jittered_backoff_without_a_random_source_is_refused() -> None:
    with pytest.raises(ValueError, match="random source"):
        Backoff(1.0, 2.0).delay(0)


@pytest.mark.parametrize(
    "arguments",
    [
        {"base": -1.0, "cap": 1.0},
        {"base": 1.0, "cap": -1.0},
        {"base": 1.0, "cap": 2.0, "factor": 0.5},
        {"base": 1.0, "cap": 2.0, "jitter": 1.5},
        {"base": 1.0, "cap": 2.0, "jitter": -0.1},
    ],
)
def test_bad_parameters_are_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**arguments)

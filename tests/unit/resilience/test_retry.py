"""Retry budget and Retry-After parsing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ballast.resilience.clock import ManualClock
from ballast.resilience.retry import RetryBudget, parse_retry_after


def drain(budget: RetryBudget, limit: int = 10_000) -> int:
    granted = 0
    while granted < limit and budget.try_withdraw():
        granted += 1
    return granted


def test_floor_lets_low_traffic_retry() -> None:
    budget = RetryBudget(ratio=0.2, window=10.0, min_per_second=0.5, clock=ManualClock())
    assert drain(budget) == 5  # 0.5/s over 10 s


def test_ratio_bounds_retries_under_load() -> None:
    budget = RetryBudget(ratio=0.2, window=10.0, min_per_second=0.0, clock=ManualClock())
    assert not budget.try_withdraw()
    for _ in range(100):
        budget.record_request()
    assert budget.available() == pytest.approx(20.0)
    assert drain(budget) == 20
    for _ in range(5):
        budget.record_request()
    assert drain(budget) == 1


def test_budget_refills_as_the_window_moves() -> None:
    clock = ManualClock(start=0.0)
    budget = RetryBudget(ratio=0.5, window=10.0, min_per_second=0.0, clock=clock)
    for _ in range(10):
        budget.record_request()
    assert drain(budget) == 5
    clock.advance(10.0)  # old requests and retries both leave the window
    assert not budget.try_withdraw()
    for _ in range(4):
        budget.record_request()
    assert drain(budget) == 2


def test_budget_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio=-1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("soon", None),
        ("-3", None),
        ("nan", None),
        ("1e3", None),
        ("9" * 400, None),  # overflows to infinity
        ("120", 120.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("0", 0.0),
    ],
)
def test_parse_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, ManualClock()) == expected


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone hours from UTC, so a date misread as local time is caught."""
    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_from_utc")
def test_parse_retry_after_http_date() -> None:
    clock = ManualClock(start=0.0, wall_offset=1_445_412_400.0)  # 2015-10-21 07:26:40 UTC
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", clock) == pytest.approx(80.0)
    assert parse_retry_after("Wed, 21 Oct 2015 07:20:00 GMT", clock) == 0.0  # past: now
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000", clock) == pytest.approx(80.0)
    assert parse_retry_after("Wed, 32 Foo 2015 07:28:00 GMT", clock) is None

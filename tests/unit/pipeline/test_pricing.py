"""A request's worst case, which its budgets reserve: every choice it asks for, at the
dearest deployment it may reach."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.config import Settings
from ballast.pipeline.context import RequestContext
from ballast.pipeline.pricing import Pricing

# Only output is priced (so a worst case is its answer's): $10 a million tokens, and the
# "dear" model 100x that.
PRICES = {
    "cheap-m": {"input": 0.0, "output": 10.0},
    "dear-m": {"input": 0.0, "output": 1000.0},
}


def pricing(*groups: dict[str, Any]) -> tuple[Pricing, Settings]:
    settings = Settings.model_validate({"prices": PRICES, "models": list(groups)})
    return Pricing(settings), settings


def group(name: str, model: str, **extra: Any) -> dict[str, Any]:
    dep = {"id": name, "url": "http://127.0.0.1:9/v1", "model": model}
    return {"name": name, "deployments": [dep], **extra}


def worst(config: tuple[Pricing, Settings], name: str, **payload: Any) -> float:
    """The worst case of a chat request for `name` with `payload`, in dollars."""
    prices, settings = config
    body = {"model": name, "messages": [], **payload}
    fallbacks = tuple(payload.get("fallbacks", ()))
    request = RequestContext(
        "/chat/completions", body, orjson.dumps(body), name, False, fallbacks=fallbacks
    )
    request.group = next(g for g in settings.models if g.name == name)
    return prices.worst_case(request)


@pytest.mark.parametrize(
    ("payload", "choices"),
    [({}, 1), ({"n": 128}, 128), ({"n": 2, "best_of": 5}, 5), ({"n": "x"}, 1)],
)
def test_every_choice_asked_for_is_reserved(payload: dict[str, Any], choices: int) -> None:
    prices = pricing(group("cheap", "cheap-m"))
    expected = 100 * choices * 10.0 / 1e6
    assert worst(prices, "cheap", max_tokens=100, **payload) == pytest.approx(expected)


def test_the_dearest_deployment_any_fallback_reaches_is_reserved() -> None:
    prices = pricing(
        group("cheap", "cheap-m"),
        group("by-context", "cheap-m", context_fallbacks=["dear"]),
        group("by-fallback", "cheap-m", fallbacks=["by-context"]),  # reaches dear through it
        group("dear", "dear-m"),
    )
    cheap, dear = 100 * 10.0 / 1e6, 100 * 1000.0 / 1e6
    assert worst(prices, "cheap", max_tokens=100) == pytest.approx(cheap)
    assert worst(prices, "by-context", max_tokens=100) == pytest.approx(dear)
    assert worst(prices, "by-fallback", max_tokens=100) == pytest.approx(dear)
    # The client's own fallbacks, for this request only.
    assert worst(prices, "cheap", max_tokens=100, fallbacks=["dear"]) == pytest.approx(dear)
    assert worst(prices, "cheap", max_tokens=100) == pytest.approx(cheap)


def test_a_responses_request_is_reserved_for_its_max_output_tokens() -> None:
    prices = pricing(group("cheap", "cheap-m"))
    assert worst(prices, "cheap", max_output_tokens=100) == pytest.approx(100 * 10.0 / 1e6)

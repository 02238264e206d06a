"""Prices: the config's over the built-in table, a dated model name priced as its base, and
an answer priced by the deployment's configured model before the reported one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ballast.config import ModelPrice, parse_settings
from ballast.pipeline.access import Access
from ballast.pipeline.pricing import Pricing
from ballast.state.db import Database
from ballast.state.keys import KeyService
from ballast.state.prices import BUILT_IN, PriceBook, undated
from ballast.state.spend import cost_of
from ballast.stream.usage import Usage, read


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("echo-2024-07-18", "echo"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
        ("mistral-large-latest", "mistral-large"),
        ("gpt-4o", "gpt-4o"),
        ("model-2024", "model-2024"),
        ("gpt-4.1-mini", "gpt-4.1-mini"),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku"),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4"),
        ("claude-3-5-haiku@20241022", "claude-3-5-haiku"),
        ("my-model-v2", "my-model-v2"),
    ],
)
def test_a_date_suffix_is_stripped(name: str, base: str) -> None:
    assert undated(name) == base


def test_a_dated_model_is_priced_and_the_config_wins() -> None:
    book = PriceBook({"echo": ModelPrice(input=1.0, output=2.0)})
    assert cost_of(book, "echo-2024-07-18", Usage(1_000_000, 1_000_000)) == 3.0
    assert book.get("gpt-4o-2024-08-06") == BUILT_IN["gpt-4o"]
    assert book.get("openai/gpt-4o-mini") == BUILT_IN["gpt-4o-mini"]
    assert book.get("unknown-model") is None
    mine = PriceBook({"gpt-4o": ModelPrice(input=9.0, output=9.0)})
    assert mine.get("gpt-4o-2024-08-06") == ModelPrice(input=9.0, output=9.0)
    assert PriceBook({}, built_in=False).get("gpt-4o") is None


def test_an_answer_is_priced_by_the_deployments_model_first() -> None:
    settings = parse_settings(
        {
            "prices": {"mine": {"input": 1.0, "output": 1.0}},
            "models": [
                {"name": "chat", "deployments": [{"id": "a", "url": "http://x", "model": "mine"}]}
            ],
        }
    )
    pricing = Pricing(settings)
    # The upstream reports a name no price knows: the deployment's configured model prices it.
    assert pricing.cost("whatever-it-says", "a", Usage(1_000_000, 0)) == 1.0
    assert pricing.cost("whatever-it-says", None, Usage(1_000_000, 0)) == 0.0
    assert pricing.cost("mine-2025-01-01", None, Usage(0, 1_000_000)) == 1.0


async def test_unpriced_deployments_are_named_at_start_up_when_a_budget_is_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = parse_settings(
        {
            "prices": {"mine": {"input": 1.0, "output": 1.0}},
            "models": [
                {"name": "chat", "deployments": [{"id": "a", "url": "http://x", "model": "mine"}]},
                {"name": "free", "deployments": [{"id": "b", "url": "http://x"}]},
                {"name": "gpt", "deployments": [{"id": "c", "url": "http://x", "model": "gpt-4o"}]},
            ],
        }
    )
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        await db.upgrade()
        keys = KeyService(db)
        access = Access(settings, keys, None, None)  # type: ignore[arg-type]
        assert access.pricing.unpriced == [("free", "b")]
        await access.start()
        assert "has no price" not in caplog.text  # no budget: nothing to warn about
        await keys.create("k", budget=1.0)
        await access.start()
        assert "deployment b of model free has no price" in caplog.text
        assert "deployment a " not in caplog.text and "deployment c " not in caplog.text
        assert access.unpriced_with_budgets == ["b"]  # the gauge's series
    finally:
        await db.close()


@pytest.mark.parametrize(
    "usage",
    [
        {
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 800},
        },
        {"input_tokens": 1000, "output_tokens": 10, "input_tokens_details": {"cached_tokens": 800}},
        {"prompt_tokens": 1000, "completion_tokens": 10, "cache_read_input_tokens": 800},
    ],
)
def test_prompt_tokens_served_from_the_cache_cost_the_cached_input_price(
    usage: dict[str, Any],
) -> None:
    prices = {"m": ModelPrice(input=2.0, output=8.0, cached_input=0.5)}
    counts = read(usage)
    assert counts == Usage(1000, 10, 800)
    # 200 fresh at $2, 800 cached at $0.50, 10 out at $8, per million
    assert cost_of(prices, "m", counts) == pytest.approx((200 * 2 + 800 * 0.5 + 80) / 1e6)
    # Without a cached price they cost the input price.
    plain = {"m": ModelPrice(input=2.0, output=8.0)}
    assert cost_of(plain, "m", counts) == pytest.approx((2000 + 80) / 1e6)
    # Never more cached than prompt, and a count that is not one is none.
    assert read({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 800}}) == (
        Usage(100, 0, 100)
    )
    assert read({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": True}}).cached == 0


def test_claude_bills_cache_writes_wherever_it_runs() -> None:
    """Anthropic's models bill writes to their cache (1.25 times the input price for 5
    minutes, twice it for an hour) on Anthropic's API, Bedrock and Vertex AI alike."""
    book = PriceBook({})
    for name in (
        "claude-sonnet-4-5-20250929",
        "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "claude-sonnet-4-5@20250929",
    ):
        price = book.get(name)
        assert price is not None and price.input == 3.0, name
        assert (price.cache_write, price.cache_write_1h) == (3.75, 6.0)
    gpt = book.get("gpt-4o")
    assert gpt is not None and gpt.cache_write is None and gpt.cache_write_1h is None

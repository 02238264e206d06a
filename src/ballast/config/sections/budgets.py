"""What requests cost and how budgets reserve it (`prices:`, `budgets:`)."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section


class ModelPrice(Section):
    """Dollars per million tokens."""

    input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)
    cached_input: float | None = Field(
        None, ge=0, description="cached prompt tokens; unset: the input price"
    )
    cache_write: float | None = Field(
        None,
        ge=0,
        description="prompt tokens written to the provider's cache (Anthropic's 5-minute"
        " cache); unset: the input price",
    )
    cache_write_1h: float | None = Field(
        None,
        ge=0,
        description="prompt tokens written to the provider's 1-hour cache; unset: cache_write",
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="the model's longest answer: a budget's worst case"
    )


class BudgetSettings(Section):
    """Budgets reserve a request's worst-case cost before it goes upstream."""

    default_max_output_tokens: int = Field(
        4096, ge=1, description="worst case of a request without max_tokens, model unknown"
    )
    grant_divisor: float = Field(
        8.0, ge=1, description="a grant takes up to what is left of a budget / this"
    )
    grant_accept_for: float = Field(30.0, gt=0, description="seconds a grant takes requests")
    grant_lapse_margin: float = Field(
        60.0,
        gt=0,
        description="seconds past grant_accept_for + the request timeout after which a grant "
        "whose holder died (kill -9) stops reserving budget",
    )
    built_in_prices: bool = Field(True, description="price known models from the built-in table")

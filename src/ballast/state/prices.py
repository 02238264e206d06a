"""What models cost: a built-in table of list prices, overridden by the config's `prices`, and
the lookup that finds a model's price by the deployment's configured model first, then by
the name the upstream reported, with a date suffix stripped (`gpt-4o-2024-08-06`,
`claude-3-5-haiku-20241022` are priced as `gpt-4o`, `claude-3-5-haiku`), and Bedrock's
vendor prefix and version too (`us.anthropic.claude-sonnet-4-20250514-v1:0` is priced as
`claude-sonnet-4`).

The built-in figures are US dollars per million tokens (input, output, cached input) and the
longest answer the model gives (`max_output_tokens`); Anthropic's models also bill writes to
their prompt cache, at 1.25 times the input price for 5 minutes and twice it for an hour
(on Anthropic's API, Bedrock and Vertex AI alike); OpenAI and Gemini bill no writes (a
write costs the input price). Reasoning tokens are output tokens, priced as output. From the
providers' public pricing and model pages (openai.com/api/pricing, anthropic.com/pricing,
ai.google.dev/gemini-api/docs/pricing, mistral.ai/pricing); for Gemini the figure for prompts
up to 128k (1.5) or 200k (2.5 Pro) tokens, for Claude Haiku 5.5 for prompts up to 100k
tokens (a longer prompt costs five times as much). Prices change: configure your own to be sure; a
configured price always wins."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ballast.config import ModelPrice

# name: (input, output, cached input, max output tokens)
_BUILT_IN: dict[str, tuple[float, float, float | None, int | None]] = {
    "gpt-4o": (2.50, 10.00, 1.25, 16_384),
    "gpt-4o-mini": (0.15, 0.60, 0.075, 16_384),
    "gpt-4.1": (2.00, 8.00, 0.50, 32_768),
    "gpt-4.1-mini": (0.40, 1.60, 0.10, 32_768),
    "gpt-4.1-nano": (0.10, 0.40, 0.025, 32_768),
    "o1": (15.00, 60.00, 7.50, 100_000),
    "o3-mini": (1.10, 4.40, 0.55, 100_000),
    "gpt-3.5-turbo": (0.50, 1.50, None, 4_096),
    "text-embedding-3-small": (0.02, 0.0, None, None),
    "text-embedding-3-large": (0.13, 0.0, None, None),
    "claude-fable-5-1": (10.00, 50.00, 1.00, 128_000),
    "claude-opus-5-5": (4.00, 20.00, 0.20, 128_000),
    "claude-opus-5": (5.00, 25.00, 0.50, 128_000),
    "claude-sonnet-5-5": (2.00, 10.00, 0.10, 128_000),
    "claude-sonnet-5": (2.00, 10.00, 0.20, 128_000),
    "claude-haiku-5-5": (0.10, 0.50, 0.01, 128_000),
    "claude-opus-4-5": (5.00, 25.00, 0.50, 64_000),
    "claude-opus-4-1": (15.00, 75.00, 1.50, 32_000),
    "claude-opus-4": (15.00, 75.00, 1.50, 32_000),
    "claude-sonnet-4-5": (3.00, 15.00, 0.30, 64_000),
    "claude-sonnet-4": (3.00, 15.00, 0.30, 64_000),
    "claude-haiku-4-5": (1.00, 5.00, 0.10, 64_000),
    "claude-3-7-sonnet": (3.00, 15.00, 0.30, 64_000),
    "claude-3-5-sonnet": (3.00, 15.00, 0.30, 8_192),
    "claude-3-5-haiku": (0.80, 4.00, 0.08, 8_192),
    "claude-3-opus": (15.00, 75.00, 1.50, 4_096),
    "claude-3-haiku": (0.25, 1.25, 0.03, 4_096),
    "gemini-2.5-pro": (1.25, 10.00, None, 65_536),
    "gemini-2.0-flash": (0.10, 0.40, 0.025, 8_192),
    "gemini-1.5-pro": (1.25, 5.00, None, 8_192),
    "gemini-1.5-flash": (0.075, 0.30, None, 8_192),
    "mistral-large": (2.00, 6.00, None, None),
}


def _writes(name: str, input_price: float) -> dict[str, float]:
    """The cache-write prices of the providers that charge them."""
    if name.startswith("claude"):
        return {"cache_write": input_price * 1.25, "cache_write_1h": input_price * 2}
    return {}


BUILT_IN: dict[str, ModelPrice] = {
    name: ModelPrice(input=i, output=o, cached_input=c, max_output_tokens=m, **_writes(name, i))
    for name, (i, o, c, m) in _BUILT_IN.items()
}

# A trailing release date: -2024-07-18, -20241022, @20241022, or -latest; on Bedrock, before
# the model's version (-v1:0), after its vendor (anthropic.) and region (us., eu., ...).
_DATED = re.compile(r"(?:[-@](?:\d{4}-\d{2}-\d{2}|\d{8})|-latest)?(?:-v\d+:\d+)?$")
_BEDROCK_VENDOR = re.compile(r"^(?:[a-z]{2,6}\.)?(?:anthropic|amazon|meta|mistral|cohere)\.")


def undated(model: str) -> str:
    return _DATED.sub("", _BEDROCK_VENDOR.sub("", model), count=1)


class PriceBook:
    """Prices by model name: the config's, then the built-in table; exact names first."""

    def __init__(self, configured: Mapping[str, ModelPrice], built_in: bool = True) -> None:
        self._prices: dict[str, ModelPrice] = {**(BUILT_IN if built_in else {}), **configured}
        self._found: dict[str, ModelPrice | None] = {}

    def get(self, model: str | None) -> ModelPrice | None:
        if not model:
            return None
        found = self._found.get(model, self)
        if found is not self:
            return found  # type: ignore[return-value]
        price = self._prices.get(model)
        if price is None:
            base = undated(model.rsplit("/", 1)[-1])
            price = self._prices.get(undated(model)) or self._prices.get(base)
        if len(self._found) > 10_000:
            self._found.clear()  # bounded: upstreams report what they like
        self._found[model] = price
        return price

    def __contains__(self, model: str) -> bool:
        return self.get(model) is not None

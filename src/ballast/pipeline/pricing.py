"""What a request may cost and what an answer did cost: the price book (the config's prices
over the built-in table), looked up by the deployment's configured model first, then by the
model the upstream reported; and a request's worst case, which a budget reserves before the
request goes upstream."""

from __future__ import annotations

from ballast.config import ModelGroup, Settings
from ballast.pipeline.context import RequestContext
from ballast.state.prices import PriceBook
from ballast.state.spend import cost_of


class Pricing:
    def __init__(self, settings: Settings) -> None:
        self.prices = PriceBook(settings.prices, settings.budgets.built_in_prices)
        self.default_max_output = settings.budgets.default_max_output_tokens
        # Deployment id -> the model it is configured for: a price is looked up by that first.
        self._deployment_models = {
            d.id: d.model for g in settings.models for d in g.deployments if d.model
        }
        self._group_prices: dict[int, tuple[ModelGroup, float, float, int]] = {}
        # (group, deployment) of every deployment no price is known for: it costs $0.
        self.unpriced = [
            (g.name, d.id)
            for g in settings.models
            if not g.is_wildcard
            for d in g.deployments
            if (d.model or g.name) not in self.prices
        ]

    def worst_case(self, request: RequestContext) -> float:
        """Dollars the request can cost at most: the prompt estimated from the body, the
        answer as long as `max_tokens` (or the model's longest), at the dearest deployment."""
        group = request.group
        if group is None:
            return 0.0
        entry = self._group_prices.get(id(group))
        if entry is None or entry[0] is not group:
            entry = self._group_price(group)
        _, input_price, output_price, longest = entry
        payload = request.payload
        completion = payload.get("max_completion_tokens") or payload.get("max_tokens")
        if type(completion) is not int or completion <= 0:
            completion = longest if request.path != "/embeddings" else 0
        prompt = len(request.raw) // 4 + 1
        return (prompt * input_price + completion * output_price) / 1_000_000

    def _group_price(self, group: ModelGroup) -> tuple[ModelGroup, float, float, int]:
        input_price = output_price = 0.0
        longest = 0
        for deployment in group.deployments:
            price = self.prices.get(deployment.model or group.name)
            if price is not None:
                input_price = max(input_price, price.input)
                output_price = max(output_price, price.output)
                longest = max(longest, price.max_output_tokens or 0)
        entry = (group, input_price, output_price, longest or self.default_max_output)
        if len(self._group_prices) > 1000:
            self._group_prices.clear()
        self._group_prices[id(group)] = entry
        return entry

    def cost(
        self,
        model: str,
        deployment: str | None,
        prompt: int,
        completion: int,
        cached: int = 0,
        writes: tuple[int, int] = (0, 0),
    ) -> float:
        """Dollars for an answer: priced by the deployment's configured model first, then by
        the model the upstream reported (date suffixes stripped); `cached` prompt tokens at
        the cached-input price, `writes` to the cache (5 minutes, 1 hour) at theirs."""
        configured = self._deployment_models.get(deployment) if deployment else None
        if configured is not None and configured in self.prices:
            model = configured
        return cost_of(self.prices, model, prompt, completion, cached, writes)

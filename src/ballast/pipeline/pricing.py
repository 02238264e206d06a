"""What a request may cost and what an answer did cost: the price book (the config's prices
over the built-in table), looked up by the deployment's configured model first, then by the
model the upstream reported; and a request's worst case, which a budget reserves before the
request goes upstream: every choice it asks for (`n`, `best_of`), at the dearest deployment
it may reach (its group's, its fallbacks' and context fallbacks', and the client's own
`fallbacks`)."""

from __future__ import annotations

import fnmatch

from ballast.config import ModelGroup, Settings
from ballast.pipeline.context import RequestContext
from ballast.state.prices import PriceBook
from ballast.state.spend import cost_of
from ballast.stream.usage import Usage


class Pricing:
    def __init__(self, settings: Settings) -> None:
        self.prices = PriceBook(settings.prices, settings.budgets.built_in_prices)
        self.default_max_output = settings.budgets.default_max_output_tokens
        # Deployment id -> the model it is configured for: a price is looked up by that first.
        self._deployment_models = {
            d.id: d.model for g in settings.models for d in g.deployments if d.model
        }
        self._group_prices: dict[int, tuple[ModelGroup, float, float, int]] = {}
        self._groups = {g.name: g for g in settings.models if not g.is_wildcard}
        self._wildcards = [g for g in settings.models if g.is_wildcard]
        # (group, deployment) of every deployment no price is known for: it costs $0.
        self.unpriced = [
            (g.name, d.id)
            for g in settings.models
            if not g.is_wildcard
            for d in g.deployments
            if (d.model or g.name) not in self.prices
        ]

    def worst_case(self, request: RequestContext) -> float:
        """Dollars the request can cost at most: the prompt estimated from the body, each
        choice as long as `max_tokens` (or the model's longest), at the dearest deployment
        it may reach."""
        group = request.group
        if group is None:
            return 0.0
        _, input_price, output_price, longest = self._price_of(group)
        if request.fallbacks:  # the client's own: priced for this request only
            for name in request.fallbacks:
                other = self._resolve(name)
                if other is not None:
                    _, more_in, more_out, more_long = self._price_of(other)
                    input_price = max(input_price, more_in)
                    output_price = max(output_price, more_out)
                    longest = max(longest, more_long)
        payload = request.payload
        completion = (
            payload.get("max_completion_tokens")
            or payload.get("max_tokens")
            or payload.get("max_output_tokens")
        )
        if type(completion) is not int or completion <= 0:
            completion = longest if request.path != "/embeddings" else 0
        choices = payload.get("n")
        best_of = payload.get("best_of")
        if choices is not None or best_of is not None:
            completion *= _choices(choices, best_of)
        prompt = len(request.raw) // 4 + 1
        return (prompt * input_price + completion * output_price) / 1_000_000

    def _price_of(self, group: ModelGroup) -> tuple[ModelGroup, float, float, int]:
        entry = self._group_prices.get(id(group))
        if entry is None or entry[0] is not group:
            entry = self._group_price(group)
        return entry

    def _resolve(self, name: str) -> ModelGroup | None:
        """The group a model name reaches (as routing resolves it)."""
        group = self._groups.get(name)
        if group is not None:
            return group
        for wildcard in self._wildcards:
            if fnmatch.fnmatchcase(name, wildcard.name):
                return wildcard
        return None

    def _group_price(self, group: ModelGroup) -> tuple[ModelGroup, float, float, int]:
        """The dearest input and output prices and the longest answer of every deployment
        the group's requests may reach: its own, and its fallbacks' and context fallbacks'
        (theirs in turn too)."""
        input_price = output_price = 0.0
        longest = 0
        reached, todo = [group], [group]
        while todo:
            current = todo.pop()
            for deployment in current.deployments:
                price = self.prices.get(deployment.model or current.name)
                if price is not None:
                    input_price = max(input_price, price.input)
                    output_price = max(output_price, price.output)
                    longest = max(longest, price.max_output_tokens or 0)
            for name in (*current.fallbacks, *current.context_fallbacks):
                other = self._resolve(name)
                if other is not None and all(other is not seen for seen in reached):
                    reached.append(other)
                    todo.append(other)
        entry = (group, input_price, output_price, longest or self.default_max_output)
        if len(self._group_prices) > 1000:
            self._group_prices.clear()
        self._group_prices[id(group)] = entry
        return entry

    def cost(self, model: str, deployment: str | None, usage: Usage) -> float:
        """Dollars for an answer: priced by the deployment's configured model first, then by
        the model the upstream reported (date suffixes stripped); the cache's reads and
        writes at their own prices (`cost_of`)."""
        configured = self._deployment_models.get(deployment) if deployment else None
        if configured is not None and configured in self.prices:
            model = configured
        return cost_of(self.prices, model, usage)


def _choices(n: object, best_of: object) -> int:
    """How many answers a request has generated: `n` choices, or `best_of` candidates
    (the completions API generates them all and returns `n`)."""
    count = 1
    for value in (n, best_of):
        if type(value) is int and value > count:
            count = value
    return count

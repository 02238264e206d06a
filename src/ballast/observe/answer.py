"""Who asked, what answered and what it cost, read from a finished request's context for
the metrics and the request log. Everything here runs once per request, after the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ballast.state.spend import cache_writes, cached_tokens, cost_of

# (answered model, deployment, prompt, completion, cached prompt tokens, prompt tokens
# written to the cache for 5 minutes and for an hour) -> dollars
CostOf = Callable[[str, str | None, int, int, int, tuple[int, int]], float]

# Where upstreams put their own id of a request (OpenAI, Anthropic, AWS, Azure).
_UPSTREAM_ID_HEADERS = (b"x-request-id", b"request-id", b"x-amzn-requestid", b"apim-request-id")
_MAX_ID = 200


class Answer:
    """Who asked and what it cost (a plain slotted class: built for every request)."""

    __slots__ = (
        "cached_tokens",
        "cost",
        "input_tokens",
        "key_id",
        "output_tokens",
        "provider",
        "reported",
        "shape",
    )

    def __init__(
        self,
        key_id: str,
        provider: str,
        shape: str,
        reported: bool,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_tokens: int = 0,
        cost: float = 0.0,
    ) -> None:
        self.key_id = key_id
        self.provider = provider
        self.shape = shape
        self.reported = reported  # the upstream reported usage
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cached_tokens = cached_tokens
        self.cost = cost

    @classmethod
    def of(
        cls, request: Any, router: Any, deployment: str, cost_of_answer: CostOf | None = None
    ) -> Answer:
        ticket = request.ticket
        key_id = ticket.key.id if ticket is not None else "none"
        target = router.targets.get(deployment) if router is not None else None
        provider = target.deployment.provider if target is not None else "none"
        shape = getattr(request, "shape", "openai")
        tokens = request.tokens
        if tokens is None:
            return cls(key_id, provider, shape, False)
        prompt, completion = tokens
        model = request.answered_model or request.model
        cached = cached_tokens(request.usage)
        writes = cache_writes(request.usage)
        if cost_of_answer is not None:  # the gateway's own pricing, the same as spend's
            cost = cost_of_answer(model, deployment, prompt, completion, cached, writes)
        elif router is not None:
            cost = cost_of(router.settings.prices, model, prompt, completion, cached, writes)
        else:
            cost = 0.0
        return cls(key_id, provider, shape, True, prompt, completion, cached, cost)


def upstream_request_id(headers: Any) -> str | None:
    if not headers:
        return None
    for name, value in headers:
        if name.lower() in _UPSTREAM_ID_HEADERS:
            return str(value[:_MAX_ID].decode("latin-1"))
    return None


def key_fields(key: Any, fields: dict[str, Any]) -> None:
    """The request log's "who asked" fields: the key's id and its team (None without one),
    from the key authentication found, so a refused request names its key too."""
    if key is not None:
        fields["key_id"] = key.id
        fields["team"] = key.team_id


def answer_fields(
    request: Any, router: Any, deployment: str, answer: Answer | None
) -> dict[str, Any]:
    """The request log's "who spent what" fields."""
    fields: dict[str, Any] = {
        "model_asked": request.model[:200],
        "model_answered": request.answered_model[:200] if request.answered_model else None,
        "shape": getattr(request, "shape", "openai"),
        "upstream_request_id": upstream_request_id(request.upstream_headers),
    }
    lookup = request.lookup
    fields["cache"] = lookup.status.decode("latin-1") if lookup is not None else None
    dropped = getattr(request, "dropped", ())
    if dropped:
        fields["dropped"] = list(dropped)  # what a translation left out, by name
    if answer is not None:
        fields["provider"] = answer.provider
        if answer.reported:
            fields["input_tokens"] = answer.input_tokens
            fields["output_tokens"] = answer.output_tokens
            fields["cached_tokens"] = answer.cached_tokens
            fields["cost"] = answer.cost
            if getattr(request, "usage_estimated", False):
                fields["usage_estimated"] = True  # a stream cut short: Ballast's estimate
    return fields

"""Who asked, what answered and what it cost, read from a finished request's context for
the metrics and the request log. Everything here runs once per request, after the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ballast.state.spend import cost_of
from ballast.stream.usage import NO_USAGE, Usage

# (answered model, deployment, the answer's usage) -> dollars
CostOf = Callable[[str, str | None, Usage], float]

# Where upstreams put their own id of a request (OpenAI, Anthropic, AWS, Azure).
_UPSTREAM_ID_HEADERS = (b"x-request-id", b"request-id", b"x-amzn-requestid", b"apim-request-id")
_MAX_ID = 200


class Answer:
    """Who asked and what it cost (a plain slotted class: built for every request)."""

    __slots__ = ("cost", "key_id", "provider", "reported", "shape", "usage")

    def __init__(
        self,
        key_id: str,
        provider: str,
        shape: str,
        reported: bool,
        usage: Usage = NO_USAGE,
        cost: float = 0.0,
    ) -> None:
        self.key_id = key_id
        self.provider = provider
        self.shape = shape
        self.reported = reported  # the upstream reported usage
        self.usage = usage
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
        usage = request.tokens
        if usage is None:
            return cls(key_id, provider, shape, False)
        model = request.answered_model or request.model
        if cost_of_answer is not None:  # the gateway's own pricing, the same as spend's
            cost = cost_of_answer(model, deployment, usage)
        elif router is not None:
            cost = cost_of(router.settings.prices, model, usage)
        else:
            cost = 0.0
        return cls(key_id, provider, shape, True, usage, cost)


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
            usage = answer.usage
            fields["input_tokens"] = usage.prompt
            fields["output_tokens"] = usage.completion
            # Parts of those two, as the provider billed them.
            fields["cached_tokens"] = usage.cached
            fields["cache_write_tokens"] = usage.written
            fields["cache_write_1h_tokens"] = usage.written_1h
            fields["reasoning_tokens"] = usage.reasoning
            fields["cost"] = answer.cost
            if getattr(request, "usage_estimated", False):
                fields["usage_estimated"] = True  # a stream cut short: Ballast's estimate
    return fields

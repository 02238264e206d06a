"""The attempt loop: which deployment answers a request, and what happens when one cannot.

One loop serves first attempts, failovers, hedges and continuations, with one attempt count
and one retry budget per request. For each run it walks, in order: the model group's
deployments (best first, by the group's strategy), retrying transient failures with jittered
backoff while the retry budget allows; then the group's fallbacks and the request's own
`fallbacks`. A context-length refusal switches to the group's `context_fallbacks`; a 429'd
primary whose only alternative is another model is waited for when its `Retry-After` is
short. Every deployment sits behind its own circuit breaker, so an open one costs nothing;
when every breaker is open, one bounded early probe may find a recovered deployment, and
otherwise the answer is an immediate 503 with the time until the first one may be tried."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ballast.config import ModelGroup, Settings
from ballast.observe.tracing import Tracer, attempt_attributes
from ballast.resilience import failures
from ballast.resilience.backoff import Backoff
from ballast.resilience.breaker import Permit
from ballast.resilience.clock import Clock
from ballast.resilience.failures import Action, Failure
from ballast.resilience.retry import RetryBudget
from ballast.routing.affinity import Affinity, conversation
from ballast.routing.attempt import Attempt, Verdicts
from ballast.routing.targets import Target, Targets

log = logging.getLogger("ballast.routing")

T = TypeVar("T")

# Runs one exchange on an admitted attempt, asking for `model`, and returns what the caller
# needs. A whole answer's attempt then ends here as succeeded; a stream's attempt is ended by
# its relay when the stream ends. A Failure it raises ends the attempt here.
Exchange = Callable[[Attempt, str], Awaitable[T]]


class Routable(Protocol):
    """What the loop reads of a request."""

    @property
    def path(self) -> str: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def model(self) -> str: ...
    @property
    def fallbacks(self) -> tuple[str, ...]: ...
    @property
    def allowed_models(self) -> tuple[str, ...] | None:
        """The models the client's key may use; None: every model."""
        ...


@dataclass(slots=True)
class Attempts:
    """One request's attempts, shared by its continuations: one count, one deadline."""

    deadline: float  # monotonic: the request's whole time, all attempts included
    count: int = 0
    excluded: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    deployment: str | None = None  # the one tried last
    started: bool = False  # the request was counted by the retry budget
    stream: bool = False  # a stream's attempts outlive their exchange
    skipped: list[str] = field(default_factory=list)  # fallbacks the key may not use
    conversation: int | None = None  # its prompt-cache affinity key, once one was needed
    keyed: bool = False  # `conversation` was read

    def last_failure(self) -> Failure | None:
        return self.failures[-1] if self.failures else None

    def end(self) -> None:
        """The request is over: its failures let go of their tracebacks. Each went up
        through frames that hold these attempts, which hold it: a reference cycle per
        failure, left for the collector, until the traceback goes."""
        for failure in self.failures:
            failures.forget_traceback(failure)


class _GroupExhausted(Exception):
    pass


class _SwitchToContextFallbacks(Exception):
    pass


class AttemptLoop:
    def __init__(
        self,
        settings: Settings,
        targets: Targets,
        clock: Clock,
        rng: random.Random,
        on_event: Callable[[str, dict[str, Any]], None],
        tracer: Tracer | None = None,
        on_auth: Callable[[Target], None] | None = None,
        on_health_failure: Callable[[Target], None] | None = None,
    ) -> None:
        self.settings = settings
        self.targets = targets
        self.clock = clock
        self.rng = rng
        self.on_event = on_event
        self.tracer = tracer
        routing = settings.routing
        self.verdicts = Verdicts(routing, clock, on_event, on_auth, on_health_failure)
        self.budget = RetryBudget(
            ratio=routing.retry_budget_ratio,
            min_per_second=routing.retry_budget_min_per_second,
            clock=clock,
        )
        self.affinity = Affinity(routing.affinity_entries, routing.affinity_ttl, clock)

    def begin(self, stream: bool = False) -> Attempts:
        """A new request's bookkeeping, its deadline from now."""
        return Attempts(self.clock.monotonic() + self.settings.timeouts.request, stream=stream)

    # -- chains ---------------------------------------------------------------------

    def chain(
        self, request: Routable, primary: ModelGroup, attempts: Attempts | None = None
    ) -> list[tuple[ModelGroup, str]]:
        """The model groups to try, with the model name each is asked for: only models the
        request's key may use (the others are noted in `attempts.skipped`)."""
        chain = [(primary, request.model)]
        for name in self._allowed(request, [*primary.fallbacks, *request.fallbacks], attempts):
            group = self.targets.resolve(name)
            if group is not None and all(g is not group for g, _ in chain):
                chain.append((group, name))
        return chain

    def _context_chain(
        self, request: Routable, primary: ModelGroup, attempts: Attempts
    ) -> list[tuple[ModelGroup, str]]:
        chain = []
        for name in self._allowed(request, primary.context_fallbacks, attempts):
            group = self.targets.resolve(name)
            if group is not None:
                chain.append((group, name))
        return chain

    @staticmethod
    def _allowed(request: Routable, names: list[str], attempts: Attempts | None) -> list[str]:
        allowed = request.allowed_models
        if allowed is None:
            return names
        kept = [name for name in names if name in allowed]
        if attempts is not None and len(kept) < len(names):
            attempts.skipped.extend(n for n in names if n not in allowed)
        return kept

    # -- the loop -------------------------------------------------------------------

    async def run(
        self, request: Routable, primary: ModelGroup, attempts: Attempts, exchange: Exchange[T]
    ) -> T:
        """Try deployments until one answers; raise the Failure the client should see."""
        routing = self.settings.routing
        if not attempts.started:
            attempts.started = True
            self.budget.record_request()
        count_before = attempts.count
        chain = self.chain(request, primary, attempts)
        index = 0
        while index < len(chain):
            group, model = chain[index]
            # Each later group in the chain keeps one attempt: retries of this one must not
            # use up the fallbacks' turn.
            reserve = len(chain) - index - 1
            try:
                return await self._run_group(request, group, model, attempts, exchange, reserve)
            except _SwitchToContextFallbacks:
                chain = self._context_chain(request, primary, attempts)
                index = 0
                if not chain:
                    break
                continue
            except _GroupExhausted:
                pass
            last = attempts.last_failure()
            if (
                index == 0
                and last is not None
                and last.kind is failures.RATE_LIMITED
                and last.retry_after is not None
                and len(chain) > 1
                and last.retry_after <= routing.max_retry_after_wait
                and self.clock.monotonic() + last.retry_after < attempts.deadline
                and attempts.count < routing.max_attempts
            ):
                # The only alternative is another model: waiting for the primary is better.
                await self.clock.sleep(last.retry_after)
                attempts.excluded.discard(last.deployment or "")
                try:
                    return await self._run_group(request, group, model, attempts, exchange, reserve)
                except (_GroupExhausted, _SwitchToContextFallbacks):
                    pass
            index += 1
            if index < len(chain):
                self.on_event("fallback", {"from": model, "to": chain[index][1]})
        if attempts.count == count_before:
            # Every deployment's breaker is open: one early probe may find one recovered.
            return await self._early_probe(request, primary, attempts, exchange)
        raise self._final_failure(attempts, primary)

    async def _run_group(
        self,
        request: Routable,
        group: ModelGroup,
        model: str,
        attempts: Attempts,
        exchange: Exchange[T],
        reserve: int = 0,
    ) -> T:
        """Try one group's deployments; `reserve` attempts are kept for the groups after it
        (the group's first attempt is never withheld)."""
        routing = self.settings.routing
        round_number = 0
        tried = 0
        while True:
            tried_this_round = False
            ranked = self.targets.ranked(group)
            if len(ranked) > 1 and group.prompt_affinity:
                ranked = self._affine(request, group, ranked, attempts)
            for target in ranked:
                if target.id in attempts.excluded or target.drained:
                    continue
                limit = routing.max_attempts - (reserve if tried else 0)
                if attempts.count >= limit or self.clock.monotonic() >= attempts.deadline:
                    raise _GroupExhausted
                permit = target.breaker.acquire()
                if permit is None:
                    continue
                if attempts.count > 0 and not self.budget.try_withdraw():
                    target.breaker.release(permit)
                    attempts.failures.append(
                        Failure(failures.BUDGET_EXHAUSTED, "retry budget exhausted")
                    )
                    raise _GroupExhausted
                if round_number > 0:
                    backoff = Backoff(routing.backoff_base, routing.backoff_cap)
                    delay = backoff.delay(round_number - 1, self.rng)
                    delay = min(delay, max(0.0, attempts.deadline - self.clock.monotonic()))
                    await self.clock.sleep(delay)
                tried_this_round = True
                tried += 1
                if attempts.count > 0:
                    self.on_event("retry", {"deployment": target.id, "attempt": attempts.count + 1})
                try:
                    return await self.attempt(target, permit, model, attempts, exchange)
                except Failure as failure:
                    action = failure.kind.action
                    if action is Action.RETURN:
                        raise
                    if action is Action.CONTEXT_FALLBACK:
                        raise _SwitchToContextFallbacks from None
                    if action is Action.FAILOVER:
                        attempts.excluded.add(target.id)
                    self.on_event(
                        "failover",
                        {
                            "deployment": target.id,
                            "reason": failure.kind.label,
                            "detail": failure.message,
                        },
                    )
            if not tried_this_round:
                raise _GroupExhausted
            round_number += 1

    def _affine(
        self, request: Routable, group: ModelGroup, ranked: list[Target], attempts: Attempts
    ) -> list[Target]:
        """`ranked` with the deployment that answered this conversation last put first,
        when it is ready; the conversation's key is read once per request."""
        if not attempts.keyed:
            attempts.keyed = True
            attempts.conversation = conversation(request.path, request.payload)
        if attempts.conversation is None:
            return ranked
        return self.affinity.order(group, ranked, attempts.conversation)

    async def attempt(
        self,
        target: Target,
        permit: Permit,
        model: str,
        attempts: Attempts,
        exchange: Exchange[T],
    ) -> T:
        """One counted attempt on an admitted deployment. A failure is judged and recorded
        here; a cancellation abandons the attempt (no verdict)."""
        attempts.count += 1
        attempts.deployment = target.id
        attempt = Attempt(target, permit, self.verdicts, attempts.deadline)
        try:
            if self.tracer is not None:
                with self.tracer.span("ballast.attempt", deployment=target.id, model=model) as span:
                    self.tracer.annotate(span, attempt_attributes(target, model))
                    result = await exchange(attempt, model)
            else:
                result = await exchange(attempt, model)
        except Failure as failure:
            failures.drop_references(failure)
            failure.deployment = target.id
            attempts.failures.append(failure)
            attempt.failed(failure)
            raise
        except BaseException:
            attempt.abandoned()
            raise
        if not attempts.stream:
            attempt.succeeded()
        if attempts.conversation is not None:
            self.affinity.answered(
                target,
                attempts.conversation,
                self.targets.members(target.group),
                [failure.deployment for failure in attempts.failures],
            )
        return result

    async def _early_probe(
        self, request: Routable, primary: ModelGroup, attempts: Attempts, exchange: Exchange[T]
    ) -> T:
        """Nothing could be tried because every breaker of the group is open. Rather than
        keep a deployment that may have recovered out for the rest of a long open time, let
        this request probe the one due back first (one at a time, at most once a second per
        deployment); every other request still gets its 503 at once."""
        candidates = [t for t in self.targets.members(primary) if not t.drained]
        if attempts.count < self.settings.routing.max_attempts:
            for target in sorted(candidates, key=lambda t: t.breaker.retry_after()):
                if target.id in attempts.excluded:
                    continue
                permit = target.breaker.early_probe()
                if permit is None:
                    continue
                self.on_event("early_probe", {"deployment": target.id})
                try:
                    return await self.attempt(target, permit, request.model, attempts, exchange)
                except Failure:
                    pass
                break
        raise self._final_failure(attempts, primary)

    def _final_failure(self, attempts: Attempts, primary: ModelGroup) -> Failure:
        real = [f for f in attempts.failures if f.kind is not failures.BUDGET_EXHAUSTED]
        if real or attempts.failures:
            failure = real[-1] if real else attempts.failures[-1]
            note = "; fallbacks this key may not use were skipped: "
            if attempts.skipped and note not in failure.message:  # say why none answered
                failure.message += note + ", ".join(dict.fromkeys(n[:80] for n in attempts.skipped))
            return failure
        members = self.targets.members(primary)
        waits = [t.breaker.retry_after() for t in members if not t.drained]
        retry_after = min(waits) if waits else self.settings.routing.rate_limit_cooldown
        return Failure(
            failures.UNAVAILABLE,
            f"every deployment of '{primary.name}' is unavailable",
            retry_after=max(1.0, retry_after),
        )

    # -- hedged first token ---------------------------------------------------------

    def hedge_delay(self, target: Target) -> float | None:
        routing = self.settings.routing
        if routing.hedge_after is not None:
            return routing.hedge_after
        if routing.hedge_on_p95:
            return target.health.p95_ttft()
        return None

    def hedge_target(self, busy: Target, attempts: Attempts) -> tuple[Target, Permit] | None:
        """A second deployment for a hedge, admitted like any other attempt: within the
        request's attempt count and the retry budget."""
        if attempts.count >= self.settings.routing.max_attempts:
            return None
        for candidate in self.targets.ranked(busy.group):
            if candidate is busy or candidate.id in attempts.excluded or candidate.drained:
                continue
            permit = candidate.breaker.acquire()
            if permit is None:
                continue
            if not self.budget.try_withdraw():
                candidate.breaker.release(permit)
                return None
            return candidate, permit
        return None


async def first_success(
    primary: asyncio.Future[T], backup: asyncio.Future[T], discard: Callable[[T], None]
) -> T:
    """The first of two tries to succeed; the loser is cancelled, or `discard`ed when it
    succeeded too. When both fail, the primary's failure is the one that counts."""
    pending: set[asyncio.Future[T]] = {primary, backup}
    errors: dict[int, BaseException] = {}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winners = [t for t in done if not t.cancelled() and t.exception() is None]
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    errors[id(task)] = error
            if winners:
                winner = winners[0]
                for loser in winners[1:]:
                    discard(loser.result())
                for task in pending:
                    task.cancel()
                for result in await asyncio.gather(*pending, return_exceptions=True):
                    if not isinstance(result, BaseException):
                        discard(result)
                return winner.result()
    finally:
        for task in (primary, backup):
            if not task.done():
                task.cancel()
    raise errors.get(id(primary)) or errors[id(backup)]

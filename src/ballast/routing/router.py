"""The attempt loop: which deployment answers a request, and what happens when one cannot.

For each request the router walks, in order: the model group's deployments (best first, by
the group's strategy), retrying transient failures with jittered backoff while the retry
budget allows; then the group's fallbacks and the request's own `fallbacks`. A context-length
refusal switches to the group's `context_fallbacks`. Every deployment sits behind its own
circuit breaker, so an open one costs nothing; when all are open the answer is an immediate
503 with the time until the first one may be probed again."""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from ballast.config import Deployment, ModelGroup, Settings
from ballast.observe.tracing import build_tracer
from ballast.resilience import failures
from ballast.resilience.breaker import BreakerConfig, CircuitBreaker, Permit
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.failures import Action, Failure
from ballast.resilience.handles import HandleCache, HandleUnavailable
from ballast.resilience.retry import RetryBudget, backoff_delay
from ballast.routing.health import DeploymentHealth, choose
from ballast.state.db import Database
from ballast.state.sessions import SessionStore
from ballast.state.shared_handles import SharedHandles
from ballast.state.store import RedisStore
from ballast.upstream.actor import ActorRuns
from ballast.upstream.client import Route, Upstream
from ballast.upstream.exchange import Reply, UpstreamStream, fetch, open_stream

log = logging.getLogger("ballast.router")

T = TypeVar("T")


@dataclass(slots=True)
class ProxyRequest:
    """What the router needs of a client request: the parsed body and where it goes."""

    path: str  # "/chat/completions", "/completions" or "/embeddings"
    payload: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    request_id: str | None = None
    fallbacks: tuple[str, ...] = ()
    authorization: bytes | None = None  # the client's Authorization header, as sent
    attempted: Attempted | None = None  # set when routing starts (logs and metrics read it)
    _credential: str | None = None

    @property
    def credential(self) -> str:
        """Who is asking, as a stable, non-reversible id (never the key itself): remote
        resources are kept per credential. Hashed only for the requests that need it."""
        if self._credential is None:
            given = self.authorization
            self._credential = hashlib.sha256(given).hexdigest()[:24] if given else "anonymous"
        return self._credential


@dataclass(slots=True)
class Target:
    """A deployment at run time: its pool, its breaker and its health."""

    deployment: Deployment
    group: ModelGroup
    upstream: Upstream
    breaker: CircuitBreaker
    health: DeploymentHealth
    drained: bool = False
    handles: HandleCache | None = None  # for deployments that hand out per-run endpoints

    @property
    def id(self) -> str:
        return self.deployment.id


@dataclass(slots=True)
class Attempted:
    """Bookkeeping of one request's attempts, shared with a stream's continuation."""

    deadline: float
    count: int = 0
    excluded: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    deployment: str | None = None  # the one tried last


class Router:
    def __init__(
        self,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        database: Database | None = None,
        store: RedisStore | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_event = on_event or (lambda name, fields: None)
        routing = settings.routing
        self.budget = RetryBudget(
            ratio=routing.retry_budget_ratio,
            min_per_second=routing.retry_budget_min_per_second,
            clock=clock,
        )
        b = routing.breaker
        self._breaker_config = BreakerConfig(
            failure_threshold=b.failure_threshold,
            failure_rate=b.failure_rate,
            window=b.window,
            min_calls=b.min_calls,
            open_time=b.open_time,
            max_open_time=b.max_open_time,
            half_open_probes=b.half_open_probes,
            probe_timeout=b.probe_timeout,
        )
        self.targets: dict[str, Target] = {}
        self._by_group: dict[str, list[Target]] = {}
        self._exact: dict[str, ModelGroup] = {}
        self._wildcards: list[ModelGroup] = []
        self.tracer = build_tracer(settings.observe.tracing)
        self.database = database or Database(settings.state.database_url)
        self.store = store
        self.sessions = SessionStore(self.database)
        for group in settings.models:
            if group.is_wildcard:
                self._wildcards.append(group)
            else:
                self._exact[group.name] = group
            members = []
            for dep in group.deployments:
                target = Target(
                    dep,
                    group,
                    Upstream(dep, settings.timeouts_for(dep), settings.upstream),
                    CircuitBreaker(dep.id, self._breaker_config, clock, self._on_transition),
                    DeploymentHealth(dep.id, clock, window=routing.health_window),
                )
                if dep.provider == "actor":
                    runs = ActorRuns(target.upstream, self.sessions)
                    target.handles = HandleCache(
                        runs.create,
                        runs.release,
                        clock,
                        refresh_margin=routing.handle_refresh_margin,
                    )
                    if store is not None:
                        target.handles.shared = SharedHandles(store, dep.id, clock)
                self.targets[dep.id] = target
                members.append(target)
            self._by_group[group.name] = members

    # -- life cycle ----------------------------------------------------------------

    async def start(self) -> None:
        for target in self.targets.values():
            await target.upstream.start()
        warm = self.settings.upstream.warm_connections
        await asyncio.gather(*(t.upstream.warm(warm) for t in self.targets.values()))

    async def close(self) -> None:
        for target in self.targets.values():
            if target.handles is not None:
                await target.handles.close()
            await target.upstream.close()

    def _on_transition(self, name: str, old: Any, new: Any) -> None:
        log.warning("breaker %s: %s -> %s", name, old.value, new.value)
        self.on_event("breaker", {"deployment": name, "from": old.value, "to": new.value})

    # -- resolution ----------------------------------------------------------------

    def resolve(self, model: str) -> ModelGroup | None:
        group = self._exact.get(model)
        if group is not None:
            return group
        for group in self._wildcards:
            if fnmatch.fnmatchcase(model, group.name):
                return group
        return None

    def public_models(self) -> list[str]:
        return [g.name for g in self.settings.models if not g.is_wildcard]

    def _ranked(self, group: ModelGroup) -> list[Target]:
        members = self._by_group[group.name]
        if len(members) == 1:
            return members
        return choose(
            members,
            group.strategy,
            health=lambda t: t.health,
            weight=lambda t: t.deployment.weight,
            rng=self.rng,
        )

    def body_for(self, target: Target, request: ProxyRequest, model: str) -> bytes:
        """The bytes to send: the client's own unless the upstream model name differs."""
        upstream_model = target.deployment.model
        if upstream_model is None or upstream_model == "*":
            upstream_model = model
        if upstream_model == request.model:
            return request.raw
        return orjson.dumps({**request.payload, "model": upstream_model})

    # -- the attempt loop ------------------------------------------------------------

    def _chain(self, request: ProxyRequest, primary: ModelGroup) -> list[tuple[ModelGroup, str]]:
        """The model groups to try, with the model name each is asked for."""
        chain = [(primary, request.model)]
        for name in [*primary.fallbacks, *request.fallbacks]:
            group = self.resolve(name)
            if group is not None and all(g is not group for g, _ in chain):
                chain.append((group, name))
        return chain

    def _context_chain(self, primary: ModelGroup) -> list[tuple[ModelGroup, str]]:
        chain = []
        for name in primary.context_fallbacks:
            group = self.resolve(name)
            if group is not None:
                chain.append((group, name))
        return chain

    async def run(
        self,
        request: ProxyRequest,
        primary: ModelGroup,
        attempt: Callable[[Target, Permit, str, Attempted], Awaitable[T]],
    ) -> T:
        """Try deployments until one answers; raise the Failure the client should see."""
        routing = self.settings.routing
        state = Attempted(self.clock.monotonic() + self.settings.timeouts.request)
        request.attempted = state
        self.budget.record_request()
        chain = self._chain(request, primary)
        index = 0
        while index < len(chain):
            group, model = chain[index]
            # Each later group in the chain keeps one attempt: retries of this one must not
            # use up the fallbacks' turn.
            reserve = len(chain) - index - 1
            try:
                return await self._run_group(group, model, state, attempt, reserve)
            except _SwitchToContextFallbacks:
                chain = self._context_chain(primary)
                index = 0
                if not chain:
                    break
                continue
            except _GroupExhausted:
                pass
            last = state.failures[-1] if state.failures else None
            if (
                index == 0
                and last is not None
                and last.kind is failures.RATE_LIMITED
                and last.retry_after is not None
                and len(chain) > 1
                and last.retry_after <= routing.max_retry_after_wait
                and self.clock.monotonic() + last.retry_after < state.deadline
                and state.count < routing.max_attempts
            ):
                # The only alternative is another model: waiting for the primary is better.
                await self.clock.sleep(last.retry_after)
                state.excluded.discard(last.deployment or "")
                try:
                    return await self._run_group(group, model, state, attempt, reserve)
                except (_GroupExhausted, _SwitchToContextFallbacks):
                    pass
            index += 1
            if index < len(chain):
                self.on_event("fallback", {"from": model, "to": chain[index][1]})
        if state.count == 0:
            # Every deployment's breaker is open: one early probe may find one recovered.
            return await self._panic_probe(request, primary, state, attempt)
        raise self._final_failure(state, primary)

    async def _panic_probe(
        self,
        request: ProxyRequest,
        primary: ModelGroup,
        state: Attempted,
        attempt: Callable[[Target, Permit, str, Attempted], Awaitable[T]],
    ) -> T:
        """Nothing could be tried because every breaker of the group is open. Rather than
        keep a deployment that may have recovered out for the rest of a long open time, let
        this request probe the one due back first (one at a time, at most once a second per
        deployment); every other request still gets its 503 at once."""
        candidates = [t for t in self._by_group[primary.name] if not t.drained]
        for target in sorted(candidates, key=lambda t: t.breaker.retry_after()):
            permit = target.breaker.early_probe()
            if permit is None:
                continue
            state.count += 1
            self.on_event("early_probe", {"deployment": target.id})
            try:
                return await attempt(target, permit, request.model, state)
            except Failure as failure:
                failure.deployment = target.id
                state.failures.append(failure)
            break
        raise self._final_failure(state, primary)

    async def _run_group(
        self,
        group: ModelGroup,
        model: str,
        state: Attempted,
        attempt: Callable[[Target, Permit, str, Attempted], Awaitable[T]],
        reserve: int = 0,
    ) -> T:
        """Try one group's deployments; `reserve` attempts are kept for the groups after it
        (the group's first attempt is never withheld)."""
        routing = self.settings.routing
        round_number = 0
        tried = 0
        while True:
            tried_this_round = False
            for target in self._ranked(group):
                if target.id in state.excluded or target.drained:
                    continue
                limit = routing.max_attempts - (reserve if tried else 0)
                if state.count >= limit or self.clock.monotonic() >= state.deadline:
                    raise _GroupExhausted
                permit = target.breaker.acquire()
                if permit is None:
                    continue
                if state.count > 0 and not self.budget.try_withdraw():
                    target.breaker.release(permit)
                    state.failures.append(
                        Failure(failures.BUDGET_EXHAUSTED, "retry budget exhausted")
                    )
                    raise _GroupExhausted
                if round_number > 0:
                    delay = backoff_delay(
                        round_number - 1, routing.backoff_base, routing.backoff_cap, self.rng
                    )
                    delay = min(delay, max(0.0, state.deadline - self.clock.monotonic()))
                    await self.clock.sleep(delay)
                tried_this_round = True
                tried += 1
                state.count += 1
                state.deployment = target.id
                if state.count > 1:
                    self.on_event("retry", {"deployment": target.id, "attempt": state.count})
                try:
                    return await attempt(target, permit, model, state)
                except Failure as failure:
                    failure.deployment = target.id
                    state.failures.append(failure)
                    action = failure.kind.action
                    if action is Action.RETURN:
                        raise
                    if action is Action.CONTEXT_FALLBACK:
                        raise _SwitchToContextFallbacks from None
                    if action is Action.FAILOVER:
                        state.excluded.add(target.id)
                    self.on_event(
                        "failover", {"deployment": target.id, "reason": failure.kind.label}
                    )
            if not tried_this_round:
                raise _GroupExhausted
            round_number += 1

    def _final_failure(self, state: Attempted, primary: ModelGroup) -> Failure:
        real = [f for f in state.failures if f.kind is not failures.BUDGET_EXHAUSTED]
        if real:
            return real[-1]
        waits = [t.breaker.retry_after() for t in self._by_group[primary.name] if not t.drained]
        retry_after = min(waits) if waits else self.settings.routing.rate_limit_cooldown
        if state.failures:
            return state.failures[-1]
        return Failure(
            failures.UNAVAILABLE,
            f"every deployment of '{primary.name}' is unavailable",
            retry_after=max(1.0, retry_after),
        )

    # -- verdicts --------------------------------------------------------------------

    def judge(self, target: Target, permit: Permit, failure: Failure) -> None:
        """Tell the breaker what a failure says about the deployment."""
        kind = failure.kind
        breaker = target.breaker
        if kind is failures.RATE_LIMITED:
            breaker.release(permit)
            breaker.force_open(failure.retry_after or self.settings.routing.rate_limit_cooldown)
            self.on_event("cooldown", {"deployment": target.id, "seconds": failure.retry_after})
        elif kind is failures.UPSTREAM_AUTH:
            breaker.release(permit)
            breaker.force_open(self.settings.routing.auth_cooldown)
            log.error(
                "deployment %s refused our upstream credentials (%s); cooling it down for %ss",
                target.id,
                failure.status,
                self.settings.routing.auth_cooldown,
            )
        elif kind is failures.POOL_TIMEOUT:
            breaker.release(permit)
        elif kind.health_failure:
            breaker.record_failure(permit, failure.retry_after)
        else:
            breaker.record_success(permit)

    def via_handle(
        self,
        target: Target,
        request: ProxyRequest,
        model: str,
        call: Callable[[Route | None], Awaitable[T]],
    ) -> Awaitable[T]:
        """Run `call` on the deployment, through a remote resource handle where it uses one.
        Exactly a `sampling_run_inactive` 409 (or an expired run token) replaces the handle
        that failed and retries once; any other answer is returned as it is. A plain
        deployment without tracing gets `call` itself: no extra frame on the hot path."""
        if self.tracer is not None:
            return self._traced(target, request, model, call)
        if target.handles is None:
            return call(None)
        return self._via_handle(target, request, model, call)

    async def _traced(
        self,
        target: Target,
        request: ProxyRequest,
        model: str,
        call: Callable[[Route | None], Awaitable[T]],
    ) -> T:
        assert self.tracer is not None
        with self.tracer.span(
            "ballast.attempt", deployment=target.id, model=model, stream=request.stream
        ):
            if target.handles is None:
                return await call(None)
            return await self._via_handle(target, request, model, call)

    async def _via_handle(
        self,
        target: Target,
        request: ProxyRequest,
        model: str,
        call: Callable[[Route | None], Awaitable[T]],
    ) -> T:
        cache = target.handles
        assert cache is not None
        key = (request.credential, model)
        try:
            handle = await cache.get(key)
            try:
                return await call(Route(handle.endpoint, handle.token))
            except Failure as failure:
                if not needs_new_handle(failure):
                    raise
                self.on_event("heal", {"deployment": target.id, "reason": failure.kind.label})
                log.info("deployment %s: run %s is gone, replacing it", target.id, handle.run_id)
                handle = await cache.replace(key, handle)
            return await call(Route(handle.endpoint, handle.token))
        except HandleUnavailable as exc:
            raise Failure(
                failures.HANDLE_UNAVAILABLE,
                str(exc),
                retry_after=exc.retry_after,
                deployment=target.id,
            ) from None

    # -- the two kinds of exchange ------------------------------------------------------

    async def _judged(
        self, target: Target, permit: Permit, exchange: Awaitable[T], finish: bool = False
    ) -> T:
        """Run one attempt's exchange; failures get their verdict from the breaker and the
        deployment's health here, once for both kinds of exchange. `finish` ends the
        attempt's health record on success too (a stream stays in flight until it ends)."""
        health = target.health
        health.start()
        started = self.clock.monotonic()
        try:
            result = await exchange
        except Failure as failure:
            self.judge(target, permit, failure)
            health.finish(not failure.kind.health_failure)
            raise
        except BaseException:
            target.breaker.release(permit)
            health.abandon()
            raise
        target.breaker.record_success(permit)
        if finish:
            health.finish(True, latency=self.clock.monotonic() - started)
        return result

    async def complete(self, request: ProxyRequest, group: ModelGroup) -> Reply:
        def attempt(
            target: Target, permit: Permit, model: str, state: Attempted
        ) -> Awaitable[Reply]:
            body = self.body_for(target, request, model)
            return self._judged(
                target,
                permit,
                self.via_handle(
                    target,
                    request,
                    model,
                    lambda route: fetch(
                        target.upstream,
                        request.path,
                        body,
                        state.deadline,
                        self.clock,
                        request.request_id,
                        route,
                    ),
                ),
                finish=True,
            )

        try:
            reply = await self.run(request, group, attempt)
        except Failure as failure:
            if is_passthrough(failure):
                return Reply(failure.status or 502, failure.headers, failure.body or b"", None)
            raise
        return reply

    async def open(
        self,
        request: ProxyRequest,
        group: ModelGroup,
        state: Attempted | None = None,
        body_for: Callable[[Target, str], bytes] | None = None,
    ) -> tuple[Target, UpstreamStream, list[bytes], Attempted]:
        """Open a stream on the first deployment that produces a first token."""
        holder: list[Attempted] = []

        async def attempt(
            target: Target, permit: Permit, model: str, attempted: Attempted
        ) -> tuple[Target, UpstreamStream, list[bytes], Attempted]:
            holder.append(attempted)
            first = self._open_on(target, permit, request, model, attempted, body_for)
            delay = self._hedge_delay(target)
            if delay is None:
                return await first
            return await self._hedged(first, delay, target, request, model, attempted, body_for)

        if state is not None:
            return await self._run_group_chain(request, group, state, attempt)
        return await self.run(request, group, attempt)

    async def _open_on(
        self,
        target: Target,
        permit: Permit,
        request: ProxyRequest,
        model: str,
        attempted: Attempted,
        body_for: Callable[[Target, str], bytes] | None,
    ) -> tuple[Target, UpstreamStream, list[bytes], Attempted]:
        body = body_for(target, model) if body_for else self.body_for(target, request, model)
        started = self.clock.monotonic()
        stream, held = await self._judged(
            target,
            permit,
            self.via_handle(
                target,
                request,
                model,
                lambda route: open_stream(
                    target.upstream, request.path, body, self.clock, request.request_id, route
                ),
            ),
        )
        # The stream stays in flight for its health until the relay ends it.
        stream.started = started
        stream.ttft = self.clock.monotonic() - started
        return target, stream, held, attempted

    # -- hedged first token ----------------------------------------------------------

    def _hedge_delay(self, target: Target) -> float | None:
        routing = self.settings.routing
        if routing.hedge_after is not None:
            return routing.hedge_after
        if routing.hedge_on_p95:
            return target.health.p95_ttft()
        return None

    async def _hedged(
        self,
        first: Awaitable[tuple[Target, UpstreamStream, list[bytes], Attempted]],
        delay: float,
        target: Target,
        request: ProxyRequest,
        model: str,
        attempted: Attempted,
        body_for: Callable[[Target, str], bytes] | None,
    ) -> tuple[Target, UpstreamStream, list[bytes], Attempted]:
        """No first token after `delay`: ask a second deployment too; the first to produce a
        token wins and the other is cancelled (its connection dropped, not pooled)."""
        primary = asyncio.ensure_future(first)
        done, _ = await asyncio.wait({primary}, timeout=delay)
        if done:
            return primary.result()
        backup = self._hedge_target(target, attempted)
        if backup is None:
            return await primary
        self.on_event("hedge", {"deployment": backup[0].id, "after": target.id})
        attempted.count += 1
        second = asyncio.ensure_future(
            self._open_on(backup[0], backup[1], request, model, attempted, body_for)
        )
        return await _first_success(primary, second)

    def _hedge_target(self, busy: Target, attempted: Attempted) -> tuple[Target, Permit] | None:
        for candidate in self._ranked(busy.group):
            if candidate is busy or candidate.id in attempted.excluded or candidate.drained:
                continue
            permit = candidate.breaker.acquire()
            if permit is None:
                continue
            if not self.budget.try_withdraw():
                candidate.breaker.release(permit)
                return None
            return candidate, permit
        return None

    async def _run_group_chain(
        self,
        request: ProxyRequest,
        group: ModelGroup,
        state: Attempted,
        attempt: Callable[[Target, Permit, str, Attempted], Awaitable[T]],
    ) -> T:
        """Continue an existing request's attempts (a stream's continuation)."""
        chain = self._chain(request, group)
        for index, (candidate, model) in enumerate(chain):
            try:
                return await self._run_group(
                    candidate, model, state, attempt, len(chain) - index - 1
                )
            except (_GroupExhausted, _SwitchToContextFallbacks):
                continue
        raise self._final_failure(state, group)


async def _first_success(
    primary: asyncio.Future[tuple[Target, UpstreamStream, list[bytes], Attempted]],
    backup: asyncio.Future[tuple[Target, UpstreamStream, list[bytes], Attempted]],
) -> tuple[Target, UpstreamStream, list[bytes], Attempted]:
    """The first of two opens to succeed; the loser is cancelled or closed. When both fail,
    the primary's failure is the one that counts."""
    pending: set[asyncio.Future[tuple[Target, UpstreamStream, list[bytes], Attempted]]] = {
        primary,
        backup,
    }
    errors: dict[int, BaseException] = {}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winners = [t for t in done if not t.cancelled() and t.exception() is None]
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    errors[id(task)] = task.exception()  # type: ignore[assignment]
            if winners:
                winner = winners[0]
                for loser in winners[1:]:
                    loser.result()[1].close()
                for task in pending:
                    task.cancel()
                for result in await asyncio.gather(*pending, return_exceptions=True):
                    if isinstance(result, tuple):
                        result[1].close()
                return winner.result()
    finally:
        for task in (primary, backup):
            if not task.done():
                task.cancel()
    raise errors.get(id(primary)) or errors[id(backup)]


def needs_new_handle(failure: Failure) -> bool:
    if failure.status == 409:
        return failures.error_code(failure.body) == "sampling_run_inactive"
    if failure.status == 401:
        return failures.error_code(failure.body) in ("token_expired", "invalid_token")
    if failure.status == 404:
        return failures.error_code(failure.body) == "run_not_found"  # the actor restarted
    return False


def is_passthrough(failure: Failure) -> bool:
    """An upstream's own refusal of the request itself: the client sees it unchanged."""
    return failure.status is not None and failure.kind.action in (
        Action.RETURN,
        Action.CONTEXT_FALLBACK,
    )


class _GroupExhausted(Exception):
    pass


class _SwitchToContextFallbacks(Exception):
    pass

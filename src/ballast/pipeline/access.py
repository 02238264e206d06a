"""Who may ask, for what, and how much: keys, model allowlists, budgets and rate limits before
a request is routed; usage and spend after it answered."""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import math
import uuid
from typing import Any

from ballast.config import ModelGroup, Settings
from ballast.pipeline.asgi import Scope, header
from ballast.pipeline.context import RequestContext, Ticket
from ballast.pipeline.errors import ApiError
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.budget_ledger import LedgerUnavailable
from ballast.state.budgets import BudgetExceeded, Budgets, Hold
from ballast.state.keys import KeyRecord, KeyService, KeysUnavailable
from ballast.state.prices import PriceBook
from ballast.state.ratelimit import Limits, RateLimited, RateLimiter
from ballast.state.spend import SpendRecorder, cost_of, period_of

log = logging.getLogger("ballast.access")

MASTER = KeyRecord(id="master", name="master key")
MAX_RECENT_KEYS = 10_000
DEFAULT_COMPLETION_ESTIMATE = 256


def invalid_key(message: str = "Incorrect API key provided.") -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def bearer(scope: Scope, authorization: bytes | None = None) -> str | None:
    """The key a request carries: `Authorization: Bearer <key>`, else an `api-key` header.
    `authorization`: that header's value when the caller has read it already."""
    value = authorization if authorization is not None else header(scope, b"authorization")
    if value is None:
        value = header(scope, b"api-key")
        return value.decode("latin-1").strip() if value else None
    text = value.decode("latin-1").strip()
    if text[:7].lower() != "bearer ":
        return None
    return text[7:].strip() or None


MAX_TOKEN_COUNT = 2**31 - 1  # the spend table's INTEGER columns (PostgreSQL's int4)


def token_counts(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens from the usage an upstream reported. Anything that is not
    a sane count is 0, and counts are capped at what the spend table stores: an upstream's
    garbage must not fail an answered request, nor a spend batch (and its replays) for good."""
    if not isinstance(usage, dict):
        return 0, 0
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int:
    if type(value) is int:  # not a bool
        return min(value, MAX_TOKEN_COUNT) if value > 0 else 0
    if type(value) is float and value > 0 and math.isfinite(value):
        return int(min(value, MAX_TOKEN_COUNT))
    return 0


def estimate_tokens(request: RequestContext) -> int:
    """Up-front TPM estimate: the prompt's bytes / 4 plus the completion asked for."""
    payload = request.payload
    completion = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if not isinstance(completion, int) or completion <= 0:
        completion = DEFAULT_COMPLETION_ESTIMATE if request.path != "/embeddings" else 0
    return len(request.raw) // 4 + min(completion, 32_768)


class Access:
    def __init__(
        self,
        settings: Settings,
        keys: KeyService,
        limiter: RateLimiter,
        spend: SpendRecorder,
        clock: Clock = SYSTEM_CLOCK,
        budgets: Budgets | None = None,
    ) -> None:
        master = settings.server.master_key
        self._master = master.get_secret_value().encode() if master is not None else None
        self.keys = keys
        self.limiter = limiter
        self.spend = spend
        self.clock = clock
        self.prices = PriceBook(settings.prices, settings.budgets.built_in_prices)
        self.budgets = budgets
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
        self.enabled = self._master is not None
        # While open, whether a key exists is asked again at most this often (any worker or
        # instance may create the first one); once one exists, Ballast stays closed.
        self.open_recheck = 1.0
        self._open_until = 0.0
        self._open_check: asyncio.Future[bool] | None = None
        self._budget_cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._refreshing: dict[tuple[str, str], asyncio.Future[float]] = {}
        # Spend event ids: unique across processes and restarts (a random prefix per
        # process) without a random draw per request; zero-padded, so one process's ids
        # sort in order and land at the end of the primary key's index.
        self._event_prefix = uuid.uuid4().hex[:16] + "-"
        self._event_ids = itertools.count(1)
        # Authorization headers that carried a valid key recently -> (key, until, the key
        # service's revocations then). A repeat skips parsing, the master key comparison and
        # the hash: about 8 us a request in place, where OpenSSL's code is rarely in cache.
        # Kept no longer than the key service's cache keeps the key; a revocation here
        # voids every entry.
        self._recent: dict[bytes, tuple[KeyRecord, float, int]] = {}

    async def start(self) -> None:
        if not self.enabled:
            self.enabled = await self.keys.count() > 0
            self._open_until = self.clock.monotonic() + self.open_recheck
        if self.unpriced and await self.keys.budgeted():
            for group, deployment in self.unpriced:
                log.warning(
                    "deployment %s of model %s has no price: its answers cost $0 and no budget"
                    " counts them (set `prices`)",
                    deployment,
                    group,
                )
        if not self.enabled:
            log.warning(
                "NO MASTER KEY AND NO API KEYS: Ballast is running OPEN; anyone who can reach "
                "it can use every model. Set server.master_key and create keys."
            )

    async def required(self) -> bool:
        """Whether requests need a key: from the moment the first key exists anywhere (this
        process sees its own at once, others within `open_recheck`), without a restart."""
        if self.enabled:
            return True
        if self.keys.created:
            self.enabled = True
            log.warning("a key exists now: every request needs one from here on")
        elif self.clock.monotonic() >= self._open_until:
            check = self._open_check
            if check is None:  # one count query at a time, shared by the requests waiting
                check = asyncio.get_running_loop().create_task(self._keys_exist())
                self._open_check = check
            self.enabled = await asyncio.shield(check)
        return self.enabled

    async def _keys_exist(self) -> bool:
        try:
            exists = await self.keys.count() > 0
            if exists:
                log.warning("a key exists now: every request needs one from here on")
            return exists
        except Exception:
            log.warning("cannot count keys; staying open until the database answers")
            return False
        finally:
            self._open_until = self.clock.monotonic() + self.open_recheck
            self._open_check = None

    def is_master(self, token: str | None) -> bool:
        return (
            self._master is not None
            and token is not None
            and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._master)
        )

    async def authenticate(self, scope: Scope, authorization: bytes | None = None) -> KeyRecord:
        raw = authorization if authorization is not None else header(scope, b"authorization")
        if raw is None:  # an `api-key` header, or none
            return (await self._authenticate(bearer(scope)))[0]
        record = self._remembered(raw)
        if record is not None:
            return record
        revocations = self.keys.revocations  # one during the lookup voids what it found
        record, until = await self._authenticate(bearer(scope, raw))
        if len(self._recent) >= MAX_RECENT_KEYS:
            self._recent.clear()  # bounded; rebuilt as keys come back
        self._recent[raw] = (record, until, revocations)
        return record

    def _remembered(self, raw: bytes | None) -> KeyRecord | None:
        """The key an Authorization value carried, while that still stands; else None."""
        recent = self._recent.get(raw) if raw is not None else None
        if (
            recent is None
            or recent[1] <= self.clock.monotonic()
            or recent[2] != self.keys.revocations
        ):
            return None
        record = recent[0]
        if record.expires_at is not None and record.expires_at <= self.clock.time():
            return None
        return record

    async def _authenticate(self, token: str | None) -> tuple[KeyRecord, float]:
        """The key `token` names, and until when that stands (see `KeyService.lookup_until`)."""
        if token is None:
            raise invalid_key("You didn't provide an API key (Authorization: Bearer <key>).")
        if self.is_master(token):
            return MASTER, self.clock.monotonic() + self.keys.cache_ttl
        try:
            record, until = await self.keys.lookup_until(token)
        except KeysUnavailable:
            raise ApiError(
                503,
                "Keys cannot be verified right now; retry shortly.",
                "api_error",
                "auth_unavailable",
                headers=((b"retry-after", b"2"),),
            ) from None
        if record is None or record.revoked:
            raise invalid_key()
        if record.expires_at is not None and record.expires_at <= self.clock.time():
            raise invalid_key("This API key has expired.")
        return record, until

    async def admit(self, scope: Scope, request: RequestContext) -> Ticket | None:
        """Checks before routing; None when Ballast runs open. What is known here (a key
        seen recently, a fresh budget figure, a local limiter) is checked without awaiting
        anything: each await of a coroutine costs about half a microsecond."""
        if not self.enabled and not await self.required():
            return None
        key = self._remembered(request.authorization)
        if key is None:
            key = await self.authenticate(scope, request.authorization)
        if key.models is not None:
            if request.model not in key.models:
                raise ApiError(
                    403,
                    f"This key may not use the model '{request.model[:200]}'.",
                    "invalid_request_error",
                    "model_not_allowed",
                    "model",
                )
            request.allowed_models = key.models  # fallbacks are held to it too (routing)
        hold = await self._reserve(key, request) if key.budget is not None else None
        estimated = estimate_tokens(request)
        lease = None
        if key.rpm is not None or key.tpm is not None or key.max_parallel is not None:
            limits = Limits(key.id, key.rpm, key.tpm, key.max_parallel)
            try:
                lease = self.limiter.acquire_now(limits, estimated)
                if lease is None:
                    lease = await self.limiter.acquire_shared(limits, estimated)
            except RateLimited as limited:
                if hold is not None and self.budgets is not None:
                    self.budgets.settle(hold, 0.0)
                retry = str(max(1, round(limited.retry_after))).encode()
                raise ApiError(
                    429,
                    f"Rate limit reached for {limited.reason} on this key.",
                    "rate_limit_error",
                    "rate_limit_exceeded",
                    headers=((b"retry-after", retry), *limited.headers),
                ) from None
            except BaseException:
                if hold is not None and self.budgets is not None:
                    self.budgets.settle(hold, 0.0)
                raise
        return Ticket(key, lease, estimated, hold)

    async def _reserve(self, key: KeyRecord, request: RequestContext) -> Hold | None:
        """The request's worst-case cost, reserved against the key's budget (shared by every
        worker and instance); 429 `insufficient_quota` when it does not fit. While the
        shared ledger cannot be asked, the budget is checked against the known spend."""
        assert key.budget is not None
        period = period_of(key.budget_period, self.clock.time())
        if self.budgets is not None:
            worst = self.worst_case(request)
            hold = self.budgets.reserve_now(key.id, period, worst)
            if hold is not None:
                return hold
            try:
                return await self.budgets.reserve(key.id, period, key.budget, worst)
            except BudgetExceeded:
                raise self._over_budget(key, True) from None
            except LedgerUnavailable:
                log.warning("budget ledger unavailable; checking the known spend instead")
        spent = self._known_spend(key)
        if spent is None:
            spent = await self._spent(key)
        if spent >= key.budget:
            raise self._over_budget(key, False)
        return None

    @staticmethod
    def _over_budget(key: KeyRecord, reserved: bool) -> ApiError:
        message = f"This key has used its {key.budget_period} budget."
        if reserved:
            message = (
                f"This request's worst-case cost does not fit in what is left of this key's "
                f"{key.budget_period} budget (lower max_tokens, or wait for requests in flight)."
            )
        return ApiError(429, message, "insufficient_quota", "insufficient_quota")

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

    def _known_spend(self, key: KeyRecord) -> float | None:
        """The period's spend when no query is due: the shared figure, asked at most once a
        second per key, plus what this instance has not flushed yet. While the figure is
        being asked, requests use the old one (one query, not one per request)."""
        period = period_of(key.budget_period, self.clock.time())
        cache_key = (key.id, period)
        cached = self._budget_cache.get(cache_key)
        if cached is None:
            return None
        if cached[1] > self.clock.monotonic() or cache_key in self._refreshing:
            return cached[0] + self.spend.unflushed(key.id, period)
        return None

    async def _spent(self, key: KeyRecord) -> float:
        """The period's spend when `_known_spend` has none: the request that finds the
        shared figure old or unknown waits for a fresh one."""
        period = period_of(key.budget_period, self.clock.time())
        cache_key = (key.id, period)
        refresh = self._refreshing.get(cache_key)
        if refresh is None:
            # A task of its own: a request that goes away must not cancel it for the others.
            refresh = asyncio.get_running_loop().create_task(self._refresh(cache_key))
            self._refreshing[cache_key] = refresh
            refresh.add_done_callback(lambda _: self._refreshing.pop(cache_key, None))
        return await asyncio.shield(refresh) + self.spend.unflushed(key.id, period)

    async def _refresh(self, cache_key: tuple[str, str]) -> float:
        """The committed spend of (key, period), cached for a second."""
        key_id, period = cache_key
        unflushed = self.spend.unflushed(key_id, period)  # what key_spend adds on top
        try:
            committed = await self.spend.key_spend(key_id, period) - unflushed
        except Exception:
            log.warning("spend unavailable for a budget check; using the last known figure")
            cached = self._budget_cache.get(cache_key)
            return cached[0] if cached else 0.0
        self._budget_cache[cache_key] = (committed, self.clock.monotonic() + 1.0)
        return committed

    def cost(self, model: str, deployment: str | None, prompt: int, completion: int) -> float:
        """Dollars for an answer: priced by the deployment's configured model first, then by
        the model the upstream reported (date suffixes stripped)."""
        configured = self._deployment_models.get(deployment) if deployment else None
        if configured is not None and configured in self.prices:
            model = configured
        return cost_of(self.prices, model, prompt, completion)

    def settle(
        self,
        ticket: Ticket | None,
        model: str,
        usage: Any,
        deployment: str | None,
        cached: bool = False,
    ) -> None:
        """After the answer: reconcile the token estimate and record spend (off the path)."""
        if ticket is None:
            return
        prompt, completion = token_counts(usage)
        if ticket.lease is not None:
            # A cached answer used no upstream tokens: it does not count against TPM.
            self.limiter.release_soon(
                ticket.lease, 0 if cached else prompt + completion if usage else None
            )
        if ticket.key is MASTER or not isinstance(usage, dict):
            if ticket.hold is not None and self.budgets is not None:
                self.budgets.settle(ticket.hold, 0.0)
            return
        now = self.clock.time()
        cost = 0.0 if cached else self.cost(model, deployment, prompt, completion)
        if ticket.hold is not None and self.budgets is not None:
            self.budgets.settle(ticket.hold, cost)
        self.spend.record(
            (  # a SpendEvent's values: see `SpendRow`
                f"{self._event_prefix}{next(self._event_ids):012x}",
                ticket.key.id,
                period_of(ticket.key.budget_period, now),
                model,
                deployment,
                prompt,
                completion,
                cost,
                cached,
                now,
            )
        )

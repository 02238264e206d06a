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

from ballast.config import Settings
from ballast.pipeline.asgi import Scope, header
from ballast.pipeline.budget_gate import BudgetGate
from ballast.pipeline.context import RequestContext, Ticket
from ballast.pipeline.errors import ApiError
from ballast.pipeline.pricing import Pricing
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.budgets import Budgets, Hold
from ballast.state.keys import KeyRecord, KeyService, KeysUnavailable
from ballast.state.ratelimit import Lease, Limits, RateLimited, RateLimiter, reset_header
from ballast.state.spend import SpendRecorder, period_of
from ballast.state.teams import Team, TeamService
from ballast.stream.usage import Usage, read

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


def estimate_prompt_tokens(request: RequestContext) -> int:
    """The prompt's tokens, estimated from its (chat) body: a byte / 4, at least 1. JSON
    punctuation and field names count too, so it errs high, the safe side for planning."""
    return max(1, len(request.raw) // 4)


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
        teams: TeamService | None = None,
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.spend = spend
        self.clock = clock
        self.pricing = Pricing(settings)
        self.budgets = budgets
        self.teams = teams
        self.gate = BudgetGate(budgets, self.pricing, spend, clock)
        self.unpriced_with_budgets: list[str] = []  # deployment ids, found at start-up
        self.enabled = False
        # While open, whether a key exists is asked again at most this often (any worker or
        # instance may create the first one); once one exists, Ballast stays closed.
        self.open_recheck = 1.0
        self._open_until = 0.0
        self._open_check: asyncio.Future[bool] | None = None
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
        self._master: bytes | None = None
        self.use_master_key(settings)

    def use_master_key(self, settings: Settings) -> None:
        """Take the master key of `settings` (at start-up and on every reload): the old one
        stops at once, and no Authorization value remembered as it is trusted any longer."""
        master = settings.server.master_key
        secret = master.get_secret_value() if master is not None else ""
        self._master = secret.encode("utf-8", "surrogatepass") if secret else None
        if master is not None:  # set, even if empty: requests need a key from now on
            self.enabled = True
        self._recent = {}

    async def start(self) -> None:
        if not self.enabled:
            self.enabled = await self.keys.count() > 0
            self._open_until = self.clock.monotonic() + self.open_recheck
        if self.pricing.unpriced and await self.keys.budgeted():
            self.unpriced_with_budgets = [d for _, d in self.pricing.unpriced]
            for group, deployment in self.pricing.unpriced:
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

    def open_now(self) -> bool:
        """True while Ballast runs open and no new look for a first key is due yet."""
        return (
            not self.enabled and not self.keys.created and self.clock.monotonic() < self._open_until
        )

    def recent(self, authorization: bytes | None) -> KeyRecord | None:
        """The key an Authorization value carried, when it was seen valid recently."""
        return self._remembered(authorization) if self.enabled else None

    async def identify(self, scope: Scope, authorization: bytes | None) -> KeyRecord | None:
        """The caller's key, before anything about the request is looked at (so a caller
        without one learns nothing of which models exist); None while Ballast runs open."""
        if self.open_now() or not await self.required():
            return None
        key = self._remembered(authorization)
        if key is None:
            key = await self.authenticate(scope, authorization)
        return key

    async def admit(self, key: KeyRecord, request: RequestContext) -> Ticket:
        """The checks of a request whose key is known and whose model resolved: the key's
        model list, its budget and its rate limits (and its team's). What is known here (a
        fresh budget figure, a local limiter) is checked without awaiting anything."""
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
        team = await self._team(key) if key.team_id is not None else None
        holds = self.gate.reserve_now(key, request) if team is None else None
        if holds is None:
            holds = await self.gate.reserve(key, team, request)
        estimated = estimate_tokens(request)
        lease = team_lease = None
        try:
            if key.rpm is not None or key.tpm is not None or key.max_parallel is not None:
                limits = Limits(key.id, key.rpm, key.tpm, key.max_parallel)
                lease = self._limit_now(limits, estimated, "key")
                if lease is None:
                    lease = await self._limit(limits, estimated, "key")
            if team is not None and (team.rpm or team.tpm or team.max_parallel):
                team_lease = await self._limit(
                    Limits(team.id, team.rpm, team.tpm, team.max_parallel), estimated, "team"
                )
        except BaseException:
            self._give_back(holds, lease)
            raise
        return Ticket(key, lease, estimated, holds, team_lease)

    async def admit_job(self, key: KeyRecord, backend: str) -> None:
        """A job submitted under `key` passes its limits as a request does: its model list
        names the backend, its budget is not used up (a job has no price: nothing is
        reserved), and the submission counts against its rate limits."""
        if key is MASTER:
            return
        if not key.allows(backend):
            raise ApiError(
                403,
                f"This key may not use the job backend '{backend[:200]}'.",
                "invalid_request_error",
                "model_not_allowed",
                "backend",
            )
        await self.gate.check_spent(key)
        if key.rpm is not None or key.tpm is not None or key.max_parallel is not None:
            lease = await self._limit(Limits(key.id, key.rpm, key.tpm, key.max_parallel), 0, "key")
            self.limiter.release_soon(lease, 0)

    async def limit_call(self, key: KeyRecord) -> Lease | None:
        """A key's request and parallel limits, for a call that spends no tokens (an MCP
        tool call); the lease goes back through `release_call`. 429 past a limit."""
        if key.rpm is None and key.max_parallel is None:
            return None
        return await self._limit(Limits(key.id, key.rpm, None, key.max_parallel), 0, "key")

    def release_call(self, lease: Lease | None) -> None:
        if lease is not None:
            self.limiter.release_soon(lease, 0)

    def budget_left(self, key: KeyRecord) -> float | None:
        """Dollars left in the key's period as far as known without a query (the metrics'
        budget gauge), or None."""
        if key.budget is None:
            return None
        spent = self.gate.known_spend(key)
        return None if spent is None else key.budget - spent

    async def _team(self, key: KeyRecord) -> Team | None:
        assert key.team_id is not None
        return await self.teams.lookup(key.team_id) if self.teams is not None else None

    def _limit_now(self, limits: Limits, estimated: int, whose: str) -> Lease | None:
        """An admission the limiter can judge without a round trip; None: await `_limit`."""
        try:
            return self.limiter.acquire_now(limits, estimated)
        except RateLimited as limited:
            raise _rate_limited(limited, limits, whose) from None

    async def _limit(self, limits: Limits, estimated: int, whose: str) -> Lease:
        try:
            lease = self.limiter.acquire_now(limits, estimated)
            if lease is None:
                lease = await self.limiter.acquire_shared(limits, estimated)
            return lease
        except RateLimited as limited:
            raise _rate_limited(limited, limits, whose) from None

    def _give_back(self, holds: tuple[Hold, ...], lease: Lease | None) -> None:
        """A request refused after something was reserved for it."""
        self.gate.give_back(holds)
        if lease is not None:
            self.limiter.release_soon(lease, 0)

    def settle(
        self,
        ticket: Ticket | None,
        model: str,
        usage: Any,
        deployment: str | None,
        cached: bool = False,
        estimated: bool = False,
        counts: Usage | None = None,
    ) -> None:
        """After the answer: reconcile the token estimate and record spend (off the path).
        `estimated`: the usage is Ballast's estimate of a stream cut short, marked so in
        spend; `counts`: that usage already read."""
        if ticket is None:
            return
        if counts is None:
            counts = read(usage)
        # A cached answer used no upstream tokens: it does not count against TPM.
        tokens = 0 if cached else counts[0] + counts[1] if usage else None
        if ticket.lease is not None:
            self.limiter.release_soon(ticket.lease, tokens)
        if ticket.team_lease is not None:
            self.limiter.release_soon(ticket.team_lease, tokens)
        if ticket.key is MASTER or not isinstance(usage, dict):
            self._give_back(ticket.holds, None)
            return
        now = self.clock.time()
        cost = 0.0 if cached else self.pricing.cost(model, deployment, counts)
        if self.budgets is not None:
            for hold in ticket.holds:
                self.budgets.settle(hold, cost)
        prompt, completion, from_cache, written, long, reasoning = counts
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
                estimated,
                from_cache,
                written,
                long,
                reasoning,
            )
        )


# What each reason of a refusal counts, and the reset header that goes with it.
_LIMIT_UNITS = {
    "requests": ("requests per minute", b"x-ratelimit-reset-requests"),
    "tokens": ("tokens per minute", b"x-ratelimit-reset-tokens"),
    "parallel": ("requests at once", None),
}


def _rate_limited(limited: RateLimited, limits: Limits, whose: str) -> ApiError:
    """A 429 that says the limit and how long to wait. The wait is whole seconds, rounded
    up so a client that honours it is admitted; the refusing limit's x-ratelimit-reset
    header gives the same wait (on a refusal, the time until a request fits again)."""
    reason = limited.reason
    wait = max(1, math.ceil(limited.retry_after - 1e-6))
    unit, reset_name = _LIMIT_UNITS[reason]
    limit = {"requests": limits.rpm, "tokens": limits.tpm, "parallel": limits.max_parallel}
    headers = [
        (name, reset_header(wait) if name == reset_name else value)
        for name, value in limited.headers
    ]
    return ApiError(
        429,
        f"Rate limit reached for {reason} on this {whose}: {limit[reason]} {unit}."
        f" Retry in {wait} s.",
        "rate_limit_error",
        "rate_limit_exceeded",
        headers=((b"retry-after", b"%d" % wait), *headers),
    )

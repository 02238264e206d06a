"""Virtual API keys. Only a hash is stored; the key itself is shown once, at creation.

A lookup is served from a short-lived local cache, then Redis (behind the breaker), then the
database, with one database query per key at a time (single-flight) so an outage of Redis
never turns into a stampede on the database (seed 003). While the database is down, keys
seen recently still authenticate from the cache."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.state.db import Database
from ballast.state.schema import api_keys
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.keys")

KEY_PREFIX = "sk-bl-"
PERIODS = ("day", "month", "total")


_SHA256 = hashlib.sha256()


def hash_key(plaintext: str) -> str:
    """Keys carry 256 random bits, so a plain SHA-256 is a safe, fast one-way hash. Copied
    from an empty one: with OpenSSL 3, `hashlib.sha256()` looks the algorithm up anew on
    every call (a locked query), and this runs on every request."""
    digest = _SHA256.copy()
    digest.update(plaintext.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    name: str
    models: tuple[str, ...] | None = None  # None: every model
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget: float | None = None
    budget_period: str = "month"
    expires_at: float | None = None
    max_concurrent_jobs: int | None = None
    revoked: bool = False
    created_at: float = 0.0
    team_id: str | None = None
    model_budgets: tuple[tuple[str, float], ...] | None = None  # per model, per period
    previous_until: float | None = None  # a rotated key's old value works until then
    # MCP: "<server>" (all its tools) or "<server>/<tool>"; None: every server and tool.
    mcp: tuple[str, ...] | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def allows_tool(self, server: str, tool: str) -> bool:
        """Whether the key's MCP allowlist lets it call `tool` of `server` (deny by default
        once a list is set)."""
        allowed = self.mcp
        return allowed is None or server in allowed or f"{server}/{tool}" in allowed

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = list(self.models) if self.models is not None else None
        data["model_budgets"] = dict(self.model_budgets) if self.model_budgets else None
        data["mcp"] = list(self.mcp) if self.mcp is not None else None
        return data


class KeysUnavailable(Exception):
    """Neither the cache nor the database can say whether a key is valid."""


def _record(row: Any) -> KeyRecord:
    models = orjson.loads(row.models) if row.models else None
    return KeyRecord(
        id=row.id,
        name=row.name,
        models=tuple(models) if models is not None else None,
        rpm=row.rpm,
        tpm=row.tpm,
        max_parallel=row.max_parallel,
        budget=row.budget,
        budget_period=row.budget_period,
        expires_at=row.expires_at,
        max_concurrent_jobs=row.max_concurrent_jobs,
        revoked=bool(row.revoked),
        created_at=row.created_at,
        team_id=row.team_id,
        model_budgets=_pairs(orjson.loads(row.model_budgets)) if row.model_budgets else None,
        previous_until=row.previous_until,
        mcp=_tuple(orjson.loads(row.mcp) if row.mcp else None),
    )


def _tuple(items: list[str] | None) -> tuple[str, ...] | None:
    return tuple(items) if items is not None else None


def _pairs(budgets: dict[str, float] | None) -> tuple[tuple[str, float], ...] | None:
    return tuple(sorted(budgets.items())) if budgets else None


# What `update` may change (None clears a limit), as the database stores it.
UPDATABLE = (
    "name",
    "models",
    "rpm",
    "tpm",
    "max_parallel",
    "budget",
    "budget_period",
    "expires_at",
    "max_concurrent_jobs",
    "team_id",
    "model_budgets",
    "mcp",
)


def _column_values(values: dict[str, Any]) -> dict[str, Any]:
    """A record's public values as the columns hold them (lists and maps as JSON)."""
    out = dict(values)
    for name in ("models", "model_budgets", "mcp"):
        if name in out:
            out[name] = orjson.dumps(out[name]).decode() if out[name] is not None else None
    return out


def _encode(record: KeyRecord | None) -> bytes:
    return orjson.dumps(record.public() if record is not None else None)


def _decode(raw: bytes) -> KeyRecord | None:
    data = orjson.loads(raw)
    if data is None:
        return None
    models = data.pop("models")
    budgets = data.pop("model_budgets", None)
    return KeyRecord(
        models=tuple(models) if models is not None else None,
        model_budgets=_pairs(budgets),
        mcp=_tuple(data.pop("mcp", None)),
        **data,
    )


class KeyService:
    def __init__(
        self,
        db: Database,
        store: RedisStore | None = None,
        clock: Clock = SYSTEM_CLOCK,
        cache_ttl: float = 30.0,
        negative_ttl: float = 5.0,
    ) -> None:
        self.db = db
        self.store = store
        self.clock = clock
        self.cache_ttl = cache_ttl
        self.negative_ttl = negative_ttl
        self._cache: dict[str, tuple[KeyRecord | None, float]] = {}  # hash -> (record, until)
        self._flights: dict[str, asyncio.Future[KeyRecord | None]] = {}
        self.db_queries = 0
        self.revocations = 0  # callers that cache keys of their own drop them when it moves
        # Told the id of every key revoked or changed here (the fleet tells everyone else).
        self.listeners: list[Callable[[str], Awaitable[None]]] = []
        self.created = 0  # keys created by this process (an open gateway closes at the first)

    # -- administration -------------------------------------------------------------

    async def create(
        self,
        name: str,
        models: list[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_parallel: int | None = None,
        budget: float | None = None,
        budget_period: str = "month",
        expires_at: float | None = None,
        max_concurrent_jobs: int | None = None,
        team_id: str | None = None,
        model_budgets: dict[str, float] | None = None,
        mcp: list[str] | None = None,
    ) -> tuple[str, KeyRecord]:
        """A new key: the plaintext (shown once) and its record."""
        if budget_period not in PERIODS:
            raise ValueError(f"budget_period must be one of {', '.join(PERIODS)}")
        plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
        record = KeyRecord(
            id="key_" + uuid.uuid4().hex[:20],
            name=name,
            models=tuple(models) if models is not None else None,
            rpm=rpm,
            tpm=tpm,
            max_parallel=max_parallel,
            budget=budget,
            budget_period=budget_period,
            expires_at=expires_at,
            max_concurrent_jobs=max_concurrent_jobs,
            created_at=self.clock.time(),
            team_id=team_id,
            model_budgets=_pairs(model_budgets),
            mcp=_tuple(mcp),
        )
        values = _column_values(record.public())
        async with self.db.begin() as connection:
            await connection.execute(
                api_keys.insert().values(key_hash=hash_key(plaintext), **values)
            )
        self.created += 1
        return plaintext, record

    async def list(self) -> list[KeyRecord]:
        async with self.db.connect() as connection:
            rows = await connection.execute(api_keys.select().order_by(api_keys.c.created_at))
            return [_record(row) for row in rows]

    async def get(self, key_id: str) -> KeyRecord | None:
        async with self.db.connect() as connection:
            row = (
                await connection.execute(api_keys.select().where(api_keys.c.id == key_id))
            ).first()
        return _record(row) if row is not None else None

    async def count(self) -> int:
        async with self.db.connect() as connection:
            return int(
                (
                    await connection.execute(sa.select(sa.func.count()).select_from(api_keys))
                ).scalar_one()
            )

    async def update(self, key_id: str, changes: dict[str, Any]) -> KeyRecord | None:
        """Change a key's limits, budget, models, expiry or team (a None clears one); the
        updated record, or None when no such key exists. This process forgets the key at
        once; other processes within their cache TTL."""
        unknown = set(changes) - set(UPDATABLE)
        if unknown:
            raise ValueError(f"cannot update {', '.join(sorted(unknown))}")
        if changes.get("budget_period", "month") not in PERIODS:
            raise ValueError(f"budget_period must be one of {', '.join(PERIODS)}")
        if not changes:
            return await self.get(key_id)
        async with self.db.begin() as connection:
            result = await connection.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id)
                .values(**_column_values(changes))
                .returning(api_keys.c.key_hash, api_keys.c.previous_hash)
            )
            hashes = [h for row in result for h in row if h]
        if not hashes:
            return None
        await self._changed(key_id, hashes)
        return await self.get(key_id)

    async def rotate(self, key_id: str, grace: float) -> tuple[str, KeyRecord] | None:
        """A new value for the key (same id, limits and spend): it works at once, and the
        old one still does for `grace` seconds. None when no such usable key exists."""
        plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
        now = self.clock.time()
        async with self.db.begin() as connection:
            old = (
                await connection.execute(
                    sa.select(api_keys.c.key_hash, api_keys.c.previous_hash).where(
                        api_keys.c.id == key_id, api_keys.c.revoked.is_(False)
                    )
                )
            ).first()
            if old is None:
                return None
            await connection.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id)
                .values(
                    key_hash=hash_key(plaintext),
                    previous_hash=old.key_hash if grace > 0 else None,
                    previous_until=now + grace if grace > 0 else None,
                )
            )
        await self._changed(key_id, [h for h in old if h])
        record = await self.get(key_id)
        assert record is not None
        return plaintext, record

    async def _changed(self, key_id: str, hashes: Sequence[str]) -> None:
        """Forget cached copies of a changed or revoked key here and in Redis, and tell the
        listeners (the fleet tells every other worker and instance)."""
        self.revocations += 1
        for digest in hashes:
            self._cache.pop(digest, None)
            await self._forget(digest, key_id)
        if hashes:
            await self.changed(key_id)

    async def budgeted(self) -> int:
        """How many usable keys have a budget."""
        query = (
            sa.select(sa.func.count())
            .select_from(api_keys)
            .where(api_keys.c.budget.is_not(None), api_keys.c.revoked.is_(False))
        )
        async with self.db.connect() as connection:
            return int((await connection.execute(query)).scalar_one())

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key: its current value and, if it was rotated with a grace period, its
        old one too, here at once and elsewhere as far as the listeners reach."""
        async with self.db.begin() as connection:
            result = await connection.execute(
                api_keys.update()
                .where(api_keys.c.id == key_id)
                .values(revoked=True)
                .returning(api_keys.c.key_hash, api_keys.c.previous_hash)
            )
            hashes = [h for row in result for h in row if h]
        await self._changed(key_id, hashes)
        return bool(hashes)

    async def changed(self, key_id: str) -> None:
        """Tell the listeners a key was revoked or changed (each failure only logged)."""
        for listener in self.listeners:
            try:
                await listener(key_id)
            except Exception:
                log.exception("could not announce the change of key %s", key_id)

    def forget(self, key_id: str) -> None:
        """Another worker or instance changed this key: drop what this one remembers of it,
        and void what callers remember of any key (they compare `revocations`)."""
        stale = [d for d, (record, _) in self._cache.items() if record and record.id == key_id]
        for digest in stale:
            self._cache.pop(digest, None)
        self.revocations += 1

    async def _forget(self, digest: str, key_id: str) -> None:
        if self.store is None:
            return
        redis_key = f"ballast:key:{digest}"
        try:
            await self.store.call(lambda r: r.delete(redis_key))
        except StoreUnavailable:
            log.warning("revoked key %s; other instances see it within the cache TTL", key_id)

    # -- the hot path ---------------------------------------------------------------

    async def lookup(self, plaintext: str) -> KeyRecord | None:
        """The key's record, or None when no such key exists. Raises KeysUnavailable only
        when the key is unknown to the cache and the database cannot be asked."""
        return (await self.lookup_until(plaintext))[0]

    async def lookup_until(self, plaintext: str) -> tuple[KeyRecord | None, float]:
        """As `lookup`, with the monotonic time until which this answer stands without
        asking again: whoever remembers a key must not keep it longer."""
        digest = hash_key(plaintext)
        cached = self._cache.get(digest)
        now = self.clock.monotonic()
        if cached is not None and cached[1] > now:
            return cached
        flight = self._flights.get(digest)
        if flight is None:
            flight = asyncio.get_running_loop().create_future()
            self._flights[digest] = flight
            try:
                record = await self._fetch(digest, cached)
            except BaseException as exc:
                flight.set_exception(exc)
                flight.exception()
                raise
            else:
                flight.set_result(record)
            finally:
                self._flights.pop(digest, None)
        else:
            record = await asyncio.shield(flight)
        remembered = self._cache.get(digest)
        return record, remembered[1] if remembered is not None else now

    async def _fetch(
        self, digest: str, stale: tuple[KeyRecord | None, float] | None
    ) -> KeyRecord | None:
        redis_key = f"ballast:key:{digest}"
        if self.store is not None:
            try:
                raw = await self.store.call(lambda r: r.get(redis_key))
                if raw is not None:
                    record = _decode(raw if isinstance(raw, bytes) else raw.encode())
                    self._remember(digest, record)
                    return record
            except StoreUnavailable:
                pass
        try:
            self.db_queries += 1
            now = self.clock.time()
            match = (api_keys.c.key_hash == digest) | (
                (api_keys.c.previous_hash == digest) & (api_keys.c.previous_until > now)
            )
            async with self.db.connect() as connection:
                row = (await connection.execute(api_keys.select().where(match))).first()
        except Exception as exc:
            if stale is not None:
                log.warning("database unavailable (%s); using the cached key", type(exc).__name__)
                self._cache[digest] = (stale[0], self.clock.monotonic() + self.negative_ttl)
                return stale[0]
            raise KeysUnavailable(type(exc).__name__) from None
        record = _record(row) if row is not None else None
        ttl_cap = None
        if row is not None and row.key_hash != digest:  # a rotated key in its grace period
            ttl_cap = max(0.0, row.previous_until - now)
        self._remember(digest, record, ttl_cap)
        if self.store is not None and ttl_cap is None:
            ttl = max(1, int(self.cache_ttl))
            try:
                await self.store.call(lambda r: r.set(redis_key, _encode(record), ex=ttl))
            except StoreUnavailable:
                pass
        return record

    def _remember(self, digest: str, record: KeyRecord | None, cap: float | None = None) -> None:
        ttl = self.cache_ttl if record is not None else self.negative_ttl
        if cap is not None:
            ttl = min(ttl, cap)
        self._cache[digest] = (record, self.clock.monotonic() + ttl)
        if len(self._cache) > 100_000:
            self._cache.clear()  # bounded; entries are cheap to rebuild

"""Redis behind the one breaker (seed 003). Every call has a tight timeout; after a few
failures the breaker opens and every use takes its local fallback at once, with zero network
calls, until one probe finds Redis healthy again. Redis down at start-up is not fatal.

A request makes several Redis calls one after another (limits, budget, spend). Until the
breaker opens, each could wait out its timeout; so once a call of a request failed, the
request's other calls take their fallbacks at once (`scope_request`): no request waits on
Redis longer than one call's timeout. Background tasks (flushes, heartbeats) keep trying:
a wait there holds up no client."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from ballast.config import StateSettings, breaker_config
from ballast.resilience.breaker import BreakerOpenError, BreakerState, CircuitBreaker
from ballast.resilience.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:  # redis is imported only when a Redis URL is configured
    import redis.asyncio as redis

    from ballast.state.resp import Command

log = logging.getLogger("ballast.redis")

T = TypeVar("T")

# The current request's mark: [whether one of its Redis calls failed]. Each request runs in
# a task of its own, whose context is its own: one request's failure stops no other's calls.
_REQUEST: ContextVar[list[bool] | None] = ContextVar("ballast_redis_request", default=None)


def scope_request() -> None:
    """Called as a request starts: its Redis calls after a failed one take their fallbacks."""
    _REQUEST.set([False])


class StoreUnavailable(Exception):
    """Redis cannot be used right now; the caller takes its fallback."""


class RedisStore:
    def __init__(
        self,
        url: str,
        settings: StateSettings,
        clock: Clock = SYSTEM_CLOCK,
        on_transition: Callable[[str, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        self.timeout = settings.redis_timeout
        self.breaker = CircuitBreaker(
            "redis",
            breaker_config(settings.redis_breaker),
            clock,
            on_transition or _log_transition,
        )
        import redis.asyncio as redis_asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        self._errors: tuple[type[BaseException], ...] = (TimeoutError, RedisError, OSError)
        # No client-side retries: the breaker decides, and a retry would multiply the wait.
        self.client: redis.Redis = redis_asyncio.Redis.from_url(
            url,
            socket_timeout=self.timeout * 4,
            socket_connect_timeout=self.timeout * 4,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            max_connections=512,
        )
        from ballast.state.resp import PipelinedRedis

        # The request path's few commands take a lean connection of their own (resp.py).
        self._pipe = PipelinedRedis(url, connect_timeout=self.timeout * 4, clock=clock)
        self.calls = 0

    async def call(self, fn: Callable[[redis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation (or pipeline) through the breaker."""
        client = self.client
        request = _REQUEST.get()
        if request is not None and request[0]:
            raise StoreUnavailable("failed earlier in this request")

        async def admitted() -> T:
            self.calls += 1  # counts only calls that reach the network
            return await fn(client)

        try:
            return await self.breaker.call(admitted, self.timeout)
        except BreakerOpenError:
            raise StoreUnavailable("breaker open") from None
        except self._errors as exc:
            if request is not None:
                request[0] = True
            # A timed-out connection may be out of step with the server (a late reply still
            # on its way): drop the pooled connections so later calls start on fresh ones.
            await self._reset_connections()
            raise StoreUnavailable(type(exc).__name__) from None

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Commands in one pipelined round trip on the lean connection, through the breaker
        like `call`. An error reply comes back in its command's place (ReplyError)."""
        pipe = self._pipe
        return await self.call(lambda _client: pipe.execute(commands))

    async def _reset_connections(self) -> None:
        self._pipe.disconnect()
        try:
            await self.client.connection_pool.disconnect()
        except self._errors:
            log.info("could not close Redis connections cleanly")

    @property
    def healthy(self) -> bool:
        return self.breaker.state is BreakerState.CLOSED

    def status(self) -> dict[str, Any]:
        snapshot = self.breaker.snapshot()
        return {"configured": True, "state": snapshot["state"], "breaker": snapshot}

    async def close(self) -> None:
        await self._pipe.close()
        await self.client.aclose()


def _log_transition(name: str, old: BreakerState, new: BreakerState) -> None:
    log.warning("redis breaker: %s -> %s", old.value, new.value)

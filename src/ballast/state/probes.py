"""One background probe per deployment and interval across every worker and instance: a
short Redis lock, taken with SET NX and an expiry. Without Redis, or while its breaker is
open, each process probes on its own (the bound is then per process)."""

from __future__ import annotations

import logging

from ballast.state.store import RedisStore

log = logging.getLogger("ballast.state")

PREFIX = "ballast:probe:"


class ProbeLock:
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    async def __call__(self, deployment: str, interval: float) -> bool:
        """True when this process may probe `deployment` now."""
        if not self.store.healthy:
            return True
        ttl = max(1, int(interval * 1000) - 50)  # free again just before the next interval
        try:
            taken = await self.store.call(
                lambda r: r.set(PREFIX + deployment, b"1", nx=True, px=ttl)
            )
        except Exception:
            return True  # Redis is the optimisation here, not the authority
        return bool(taken)

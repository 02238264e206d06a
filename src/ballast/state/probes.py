"""One background probe per deployment at a time, and at most one per interval, across every
worker and instance: a lease in Redis, taken with SET NX for as long as a probe may take
(`bound`), shortened when the probe ends to what is left of the interval. A holder that
never finishes (a probe that never answers, a process killed) frees it after `bound`, so it
cannot block recovery. Without Redis, or while its breaker is open, each process probes on
its own (the bound is then per process)."""

from __future__ import annotations

import logging
import uuid

from ballast.state.store import RedisStore

log = logging.getLogger("ballast.state")

PREFIX = "ballast:probe:"

# Shorten the lease only if it is still ours (a lease that ran out may be another's now).
_SHORTEN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class ProbeLock:
    def __init__(self, store: RedisStore, bound: float = 10.0) -> None:
        self.store = store
        self.bound = bound
        self.token = uuid.uuid4().hex.encode()
        self._shorten = store.client.register_script(_SHORTEN)

    async def take(self, deployment: str, interval: float) -> bool:
        """True when this process may probe `deployment` now."""
        if not self.store.healthy:
            return True
        ttl = max(int(self.bound * 1000), int(interval * 1000) - 50)
        token = self.token
        try:
            taken = await self.store.call(
                lambda r: r.set(PREFIX + deployment, token, nx=True, px=ttl)
            )
        except Exception:
            return True  # Redis is the optimisation here, not the authority
        return bool(taken)

    async def done(self, deployment: str, interval: float, took: float) -> None:
        """The probe ended after `took` seconds: the lease lasts to the end of its interval
        (free again just before the next one), and no longer."""
        rest = max(1, int((interval - took) * 1000) - 50)
        shorten, token = self._shorten, self.token
        try:
            await self.store.call(lambda r: shorten(keys=[PREFIX + deployment], args=[token, rest]))
        except Exception:
            log.debug("probe lease of %s left to expire", deployment)

"""What every stage of one configuration generation shares: the router, the access rules,
the response cache, the request-size and stream settings, and settlement.

The stage list itself is written once, in api/routes.py, where the routes are assembled;
each stage is a module of this package (admission.py, reading.py, resolving.py,
caching.py, dispatching.py, guard.py, observing.py) over this one set of parts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ballast.config import Settings, secret_values
from ballast.pipeline.context import RequestContext
from ballast.pipeline.respond import HeaderAllowlist
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.routing.router import Router
from ballast.stream.usage import read

if TYPE_CHECKING:
    from ballast.cache.service import ResponseCache
    from ballast.pipeline.access import Access


class Pipeline:
    """The parts the stages of one generation run on. `access` and `cache` are attached at
    start-up, once state is ready; a reload's new generation takes them over."""

    def __init__(self, settings: Settings, router: Router, clock: Clock = SYSTEM_CLOCK) -> None:
        self.router = router
        self.clock = clock  # the body's and the disconnect watch's timers
        self.max_body_bytes = settings.server.max_body_bytes
        self.body_timeout = settings.server.body_timeout
        self.continuation = settings.routing.continuation
        self.keepalive = settings.routing.stream_keepalive
        self.headers_at_once = settings.routing.stream_headers_at_once
        self.expose = HeaderAllowlist(settings.upstream.expose_headers)
        # Ballast's own upstream credentials: never passed on in an upstream's error body.
        self.secrets = tuple(value.encode() for value in secret_values(settings))
        self.access: Access | None = None
        self.cache: ResponseCache | None = None  # used by groups with `cache`

    def settle(
        self,
        ctx: RequestContext,
        model: str,
        usage: Any,
        deployment: str | None,
        estimated: bool = False,
    ) -> None:
        """Usage and spend for the key, exactly once per request (the first call wins).
        `estimated`: the usage is Ballast's estimate (a stream cut short), not the upstream's."""
        if ctx.settled:
            return
        ctx.settled = True
        ctx.usage = usage
        ctx.usage_estimated = estimated
        ctx.answered_model = model or None
        counts = ctx.tokens = read(usage) if isinstance(usage, dict) else None
        if self.access is not None and ctx.ticket is not None:
            if deployment is None and ctx.attempts is not None:
                deployment = ctx.attempts.deployment  # the one that answered
            self.access.settle(
                ctx.ticket, model, usage, deployment, estimated=estimated, counts=counts
            )

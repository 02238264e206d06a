"""The reference sampling actor: a small service beside an inference server that hands out
sampling runs with short-lived tokens, proxies requests on them and reclaims idle runs.

:func:`start_actor` runs it in-process (tests, demos); :func:`run_actor` blocks until a
signal; ``ballast actor`` is the command.
"""

from __future__ import annotations

from ballast.actor.runs import Run, RunRegistry
from ballast.actor.server import ActorServer, run_actor, start_actor
from ballast.actor.tokens import TokenError, TokenIssuer

__all__ = [
    "ActorServer",
    "Run",
    "RunRegistry",
    "TokenError",
    "TokenIssuer",
    "run_actor",
    "start_actor",
]

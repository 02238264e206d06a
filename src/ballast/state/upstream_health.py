"""What one worker learns of an upstream's health, told to every worker of every instance
through Redis: pub/sub carries each verdict at once, and keys with a TTL hold the verdicts
still running, so an instance that starts (or a worker whose subscription came back) reads
where things stand.

A verdict is data, about a deployment id; routing/fleet_health.py turns it into breakers and
cooldowns. Telling one costs the request path an append to a list: a task of its own sends
them. Redis down (or its breaker open) means verdicts are neither sent nor received, and
each worker goes by what it sees alone. A verdict held in Redis expires with its key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from ballast.resilience.clock import Clock
from ballast.state.pubsub import listen
from ballast.state.resp import Command
from ballast.state.store import RedisStore, StoreUnavailable

log = logging.getLogger("ballast.health")

CHANNEL = "ballast:health"
OPEN_KEY = "ballast:health:open:"  # + deployment id; its TTL is the time the breaker stays open
COOL_KEY = "ballast:health:cool:"  # + deployment id; its TTL is the Retry-After cooldown left
DRAINED = "ballast:drained"  # the set of deployments an operator drained

FAILED, OPENED, CLOSED, DRAINED_NOW, ENABLED = "failed", "open", "closed", "drain", "enable"
_KINDS = frozenset({FAILED, OPENED, CLOSED, DRAINED_NOW, ENABLED})
_MAX_OUTBOX = 1000  # verdicts waiting to be sent; past it Redis is too slow to matter


@dataclass(frozen=True, slots=True)
class Verdict:
    """`failed`: one failed attempt. `open`: its breaker opened for `open_for` seconds, a
    Retry-After cooldown of `cool_for` among them. `closed`: a probe found it answering.
    `drain`/`enable`: an operator's order, held until undone."""

    deployment: str
    kind: str
    open_for: float = 0.0
    cool_for: float = 0.0
    origin: str = ""

    def dumps(self) -> bytes:
        return orjson.dumps([self.deployment, self.kind, self.open_for, self.cool_for, self.origin])

    @classmethod
    def loads(cls, data: bytes) -> Verdict:
        """ValueError when it is not a verdict."""
        try:
            dep, kind, open_for, cool_for, origin = orjson.loads(data)
            verdict = cls(str(dep), str(kind), float(open_for), float(cool_for), str(origin))
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"not a health verdict: {exc}") from None
        if verdict.kind not in _KINDS:
            raise ValueError(f"not a health verdict: kind {verdict.kind[:20]!r}")
        return verdict


class SharedHealth:
    """This worker's side of the fleet's shared upstream health."""

    def __init__(
        self, store: RedisStore, url: str, clock: Clock, origin: str, resubscribe: float = 1.0
    ) -> None:
        self.store = store
        self.url = url
        self.clock = clock
        self.origin = origin  # this worker's name: its own verdicts come back and are skipped
        self.resubscribe = resubscribe
        self.listener: Callable[[Verdict], None] = lambda verdict: None
        self.deployments: Callable[[], Iterable[str]] = list
        self.subscribed = False
        self.sent = 0
        self.received = 0
        self._outbox: list[Verdict] = []
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- life ---------------------------------------------------------------------------

    def start(self) -> None:
        """Send what is told and hear what others tell; the current state is read each time
        the subscription is made, this start's first included."""
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_loop()), loop.create_task(self._listen())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    @property
    def connected(self) -> bool:
        """Verdicts travel both ways now: subscribed, and Redis's breaker closed."""
        return self.subscribed and self.store.healthy

    # -- telling ------------------------------------------------------------------------

    def tell(self, verdict: Verdict) -> None:
        """Queue a verdict of this worker's for the fleet; no I/O here. Dropped while Redis
        cannot take it: the others then go by what they see themselves."""
        wake = self._wake
        if wake is None or not self.store.healthy or len(self._outbox) >= _MAX_OUTBOX:
            return
        self._outbox.append(verdict)
        wake.set()

    async def _send_loop(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            await wake.wait()
            wake.clear()
            batch, self._outbox = self._outbox, []
            commands: list[Command] = []
            for verdict in batch:
                commands += _commands(verdict)
            try:
                await self.store.execute(commands)
                self.sent += len(batch)
            except StoreUnavailable:
                pass  # the Redis breaker counted it; local verdicts stand alone
            except Exception:
                log.exception("could not share upstream health")

    # -- hearing ------------------------------------------------------------------------

    async def _listen(self) -> None:
        await listen(
            self.url, CHANNEL, self.clock, self._on_message, self._on_subscribed, self.resubscribe
        )

    async def _on_message(self, data: bytes) -> None:
        try:
            verdict = Verdict.loads(data)
        except ValueError as exc:
            log.warning("ignored a message on %s: %s", CHANNEL, exc)
            return
        if verdict.origin != self.origin:
            self._hear(verdict)

    async def _on_subscribed(self, subscribed: bool) -> None:
        self.subscribed = subscribed
        if subscribed:
            for verdict in await self.current(list(self.deployments())):
                self._hear(verdict)

    def _hear(self, verdict: Verdict) -> None:
        self.received += 1
        try:
            self.listener(verdict)
        except Exception:
            log.exception("could not apply a shared health verdict")

    async def current(self, deployments: list[str]) -> list[Verdict]:
        """The verdicts still running in Redis for these deployments (none when Redis
        cannot say)."""
        commands: list[Command] = [("SMEMBERS", DRAINED)]
        for dep in deployments:
            commands += [("PTTL", OPEN_KEY + dep), ("PTTL", COOL_KEY + dep)]
        try:
            replies = await self.store.execute(commands)
        except StoreUnavailable:
            return []
        return _verdicts(deployments, replies)


def _commands(verdict: Verdict) -> list[Command]:
    """What one verdict does in Redis: published, and held for as long as it runs. A key
    is only ever made to live longer (PEXPIRE GT), so a shorter verdict that follows a
    longer one does not cut it short."""
    dep, kind = verdict.deployment, verdict.kind
    # A drain travels as an admin command already; here it is only kept for new instances.
    quiet = kind in (DRAINED_NOW, ENABLED)
    out: list[Command] = [] if quiet else [("PUBLISH", CHANNEL, verdict.dumps())]
    if kind == OPENED:
        held = ((OPEN_KEY, verdict.open_for), (COOL_KEY, verdict.cool_for))
        for prefix, seconds in held:
            key, ms = prefix + dep, int(seconds * 1000)
            if ms > 0:
                out += [("SET", key, verdict.origin, "NX", "PX", ms), ("PEXPIRE", key, ms, "GT")]
    elif kind == CLOSED:
        out.append(("DEL", OPEN_KEY + dep, COOL_KEY + dep))
    elif kind == DRAINED_NOW:
        out.append(("SADD", DRAINED, dep))
    elif kind == ENABLED:
        out.append(("SREM", DRAINED, dep))
    return out


def _verdicts(deployments: list[str], replies: list[Any]) -> list[Verdict]:
    drained = {m.decode() if isinstance(m, bytes) else str(m) for m in replies[0] or ()}
    found = [Verdict(dep, DRAINED_NOW) for dep in deployments if dep in drained]
    for i, dep in enumerate(deployments):
        open_ms, cool_ms = replies[1 + 2 * i], replies[2 + 2 * i]
        if isinstance(open_ms, int) and open_ms > 0:
            cool = cool_ms / 1000 if isinstance(cool_ms, int) and cool_ms > 0 else 0.0
            found.append(Verdict(dep, OPENED, open_ms / 1000, cool))
    return found

"""Admin actions for every worker and every instance, and the fleet's state in one answer.

An action (drain, enable, reload, a key revoked or changed) is applied by the worker that
got it and travels three ways at once, each receiver applying it once (by its id):

- to the other workers of this instance, at once, over the Unix sockets in the directory
  the supervisor made for them (`BALLAST_FLEET_DIR`, set by `ballast serve --workers N`);
- to every worker of every instance sharing Redis, through pub/sub on `ballast:admin`;
- into the database's command log, which every worker polls: every
  `fleet.fallback_poll` seconds while Redis is down or not configured (the fallback that
  still reaches other instances), every `fleet.safety_poll` seconds otherwise (catching
  what a Redis blip lost).

Each worker also writes a summary of itself into Redis every `fleet.heartbeat` seconds,
so `/admin/state` can show every worker of every instance: this instance's workers are
asked live over their sockets, the other instances' are read from their heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from ballast.config import FleetSettings
from ballast.resilience.deadline import Deadline
from ballast.state.commands import CHANNEL, Command, CommandLog
from ballast.state.hub import StateHub
from ballast.state.pubsub import listen
from ballast.state.store import StoreUnavailable

log = logging.getLogger("ballast.fleet")

Handler = Callable[[dict[str, Any]], Awaitable[None]]
Summary = Callable[[], dict[str, Any]]
HEARTBEATS = "ballast:fleet"
INSTANCES = "ballast:fleet:instances"  # instance -> the time one of its workers last beat
MAX_LINE = 4 * 1024 * 1024
_SEEN = 10_000


def instance_id() -> str:
    """This instance's name: `BALLAST_INSTANCE_ID` (set once for all of `serve`'s workers)
    or the host's name and a random suffix (an app embedded in another process)."""
    return os.environ.get("BALLAST_INSTANCE_ID") or f"{os.uname().nodename}-{uuid.uuid4().hex[:8]}"


class Fleet:
    def __init__(self, hub: StateHub, settings: FleetSettings, redis_url: str | None) -> None:
        self.hub = hub
        self.clock = hub.clock
        self.settings = settings
        self.instance = instance_id()
        self.worker = f"{self.instance}/{os.getpid()}"
        directory = os.environ.get("BALLAST_FLEET_DIR")
        self.directory = Path(directory) if directory else None
        self.socket = self.directory / f"w-{os.getpid()}.sock" if self.directory else None
        self.commands = CommandLog(hub.db)
        self.handlers: dict[str, Handler] = {}
        self.summary: Summary = lambda: {}
        self._redis_url = redis_url
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._last_seq = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.Server | None = None
        self.applied = 0
        self.subscribed = False  # pub/sub is carrying commands to this worker
        self.instances_seen = 0  # live instances, as the heartbeats in Redis last said

    # -- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self._last_seq = await self.commands.last_seq()  # history is not replayed
        except Exception as exc:
            log.warning("admin command log unavailable at start (%s)", type(exc).__name__)
        if self.socket is not None:
            _remove(self.socket)
            self._server = await asyncio.start_unix_server(
                self._serve_peer, path=str(self.socket), limit=MAX_LINE
            )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._poll()))
        if self._redis_url:
            self._tasks.append(loop.create_task(self._subscribe(self._redis_url)))
            self._tasks.append(loop.create_task(self._heartbeat()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self.socket is not None:
            _remove(self.socket)

    # -- commands -----------------------------------------------------------------------

    async def announce(
        self, action: str, args: dict[str, Any], apply_here: bool = True
    ) -> dict[str, Any]:
        """Apply an action here (unless done already) and send it everywhere; says how far
        it got: this instance's workers reached, and whether Redis and the log took it."""
        command = Command(uuid.uuid4().hex, action, args, self.worker)
        if apply_here:
            await self.apply(command)
        else:
            self._mark(command.id)
        peers, published, logged = await asyncio.gather(
            self._tell_peers(command), publish(self.hub, command), record(self.hub, command)
        )
        return {"workers_reached": peers + 1, "redis": published, "database": logged}

    async def apply(self, command: Command) -> None:
        if not self._mark(command.id):
            return
        handler = self.handlers.get(command.action)
        if handler is None:
            log.warning("unknown admin command %r", command.action[:40])
            return
        self.applied += 1
        try:
            await handler(command.args)
        except Exception:
            log.exception("admin command %s failed here", command.action)

    def _mark(self, command_id: str) -> bool:
        """False when this command was applied already."""
        seen = self._seen
        if command_id in seen:
            return False
        seen[command_id] = None
        if len(seen) > _SEEN:
            seen.popitem(last=False)
        return True

    # -- this instance's workers --------------------------------------------------------

    def _peers(self) -> list[Path]:
        if self.directory is None:
            return []
        return [p for p in self.directory.glob("w-*.sock") if p != self.socket]

    async def _ask(self, path: Path, message: dict[str, Any]) -> Any:
        clock, timeout = self.clock, self.settings.peer_timeout
        try:
            with Deadline(clock, clock.monotonic() + timeout):
                reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE)
        except (ConnectionRefusedError, FileNotFoundError):
            _remove(path)  # a worker that is gone left its socket behind
            return None
        except (OSError, TimeoutError):
            return None
        try:
            writer.write(orjson.dumps(message) + b"\n")
            with Deadline(clock, clock.monotonic() + timeout):
                line = await reader.readline()
            return orjson.loads(line) if line else None
        except (OSError, TimeoutError, orjson.JSONDecodeError, ValueError):
            return None
        finally:
            writer.close()

    async def _tell_peers(self, command: Command) -> int:
        message = {"op": "command", "command": orjson.loads(command.dumps())}
        answers = await asyncio.gather(*(self._ask(p, message) for p in self._peers()))
        return sum(1 for a in answers if a is not None)

    async def _serve_peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            message = orjson.loads(line)
            if message.get("op") == "command":
                await self.apply(Command.loads(orjson.dumps(message["command"])))
                reply: Any = {"ok": True}
            else:
                reply = self.summary()
            writer.write(orjson.dumps(reply) + b"\n")
            await writer.drain()
        except (OSError, ValueError, orjson.JSONDecodeError, AttributeError):
            pass
        finally:
            writer.close()

    # -- every instance -----------------------------------------------------------------

    async def _subscribe(self, url: str) -> None:
        await listen(
            url,
            CHANNEL,
            self.clock,
            self._on_message,
            self._on_subscribed,
            self.settings.resubscribe,
        )

    async def _on_message(self, data: bytes) -> None:
        try:
            await self.apply(Command.loads(data))
        except ValueError as exc:
            log.warning("ignored a message on %s: %s", CHANNEL, exc)

    async def _on_subscribed(self, subscribed: bool) -> None:
        if not subscribed:
            log.warning("admin channel lost; polling the command log")
        self.subscribed = subscribed

    async def _poll(self) -> None:
        while True:
            store = self.hub.store
            redis_ok = self.subscribed and store is not None and store.healthy
            interval = self.settings.safety_poll if redis_ok else self.settings.fallback_poll
            await self.clock.sleep(interval)
            try:
                for seq, command in await self.commands.since(self._last_seq):
                    self._last_seq = seq
                    await self.apply(command)
            except Exception as exc:
                log.info("admin command log unavailable (%s)", type(exc).__name__)

    async def _heartbeat(self) -> None:
        store = self.hub.store
        assert store is not None
        while True:
            try:
                now = self.clock.time()
                beat = orjson.dumps({"ts": now, "summary": self.summary()})
                replies = await store.execute(
                    [
                        ("HSET", HEARTBEATS, self.worker, beat),
                        ("HSET", INSTANCES, self.instance, repr(now)),
                        ("HGETALL", INSTANCES),
                    ]
                )
                self._count_instances(replies[2], now)
            except StoreUnavailable:
                pass
            except Exception:
                log.exception("could not write this worker's heartbeat")
            await self.clock.sleep(self.settings.heartbeat)

    def _count_instances(self, flat: list[bytes], now: float) -> None:
        """The instances whose workers beat lately share the rate limits: each enforces its
        share of a limit when Redis is out of reach. Counted here, the number needs no
        configuring (it changes with autoscaling and during a rollout); the configured
        `state.instances` is the floor."""
        live = 0
        for stamp in flat[1::2]:
            try:
                age = now - float(stamp)
            except ValueError:
                continue
            live += age <= self.settings.heartbeat * 3 + 1
        if live:
            self.instances_seen = live
            self.hub.limiter.set_instances(live)

    # -- the fleet's state --------------------------------------------------------------

    async def view(self) -> dict[str, Any]:
        """Every worker of every instance this one can reach, and the sums."""
        local = await asyncio.gather(*(self._ask(p, {"op": "state"}) for p in self._peers()))
        workers = [self.summary(), *(w for w in local if isinstance(w, dict) and w)]
        seen = {w.get("worker") for w in workers}
        remote, reachable = await self._heartbeats()
        workers += [w for w in remote if w.get("worker") not in seen]
        workers.sort(key=lambda w: str(w.get("worker")))
        members: dict[str, list[dict[str, Any]]] = {}
        for worker in workers:
            members.setdefault(str(worker.get("instance")), []).append(worker)
        instances = {name: _sums(group) for name, group in members.items()}
        return {
            "workers": workers,
            "instances": instances,
            "sum": {**_sums(workers), "instances": len(instances)},
            "other_instances_known": reachable,
        }

    async def _heartbeats(self) -> tuple[list[dict[str, Any]], bool]:
        """Other workers' last heartbeats, fresh ones only; (found, whether Redis answered)."""
        store = self.hub.store
        if store is None:
            return [], False
        try:
            raw = await store.call(lambda r: r.hgetall(HEARTBEATS))
        except StoreUnavailable:
            return [], False
        now = self.clock.time()
        fresh, dead = [], []
        for name, data in raw.items():
            try:
                beat = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            age = now - float(beat.get("ts", 0))
            if age <= self.settings.heartbeat * 3 + 1:
                fresh.append(beat["summary"])
            elif age > 60:
                dead.append(name)
        if dead:
            with contextlib.suppress(StoreUnavailable):
                await store.call(lambda r: r.hdel(HEARTBEATS, *dead))
        return fresh, True


def _sums(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """What adds up over a set of workers."""
    return {
        "workers": len(workers),
        "in_flight": sum(int(w.get("in_flight", 0)) for w in workers),
        "shed": sum(int(w.get("shed", 0)) for w in workers),
        "commands_applied": sum(int(w.get("commands_applied", 0)) for w in workers),
    }


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def publish(hub: StateHub, command: Command) -> bool:
    """On the Redis channel (through the breaker); False when Redis cannot take it."""
    store = hub.store
    if store is None:
        return False
    data = command.dumps()
    try:
        await store.call(lambda r: r.publish(CHANNEL, data))
    except StoreUnavailable:
        return False
    return True


async def record(hub: StateHub, command: Command) -> bool:
    """In the database's command log; False when the database cannot take it."""
    try:
        await CommandLog(hub.db).append(command, hub.clock.time())
    except Exception as exc:
        log.warning("admin command not logged (%s)", type(exc).__name__)
        return False
    return True


def announce_key_changes(hub: StateHub) -> None:
    """For a process that serves nothing (the CLI): its key changes still reach every
    gateway, through Redis and the command log."""

    async def announce(key_id: str) -> None:
        command = Command(uuid.uuid4().hex, "key", {"key_id": key_id}, f"cli/{os.getpid()}")
        await asyncio.gather(publish(hub, command), record(hub, command))

    hub.keys.listeners.append(announce)

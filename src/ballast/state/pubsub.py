"""One Redis pub/sub subscription kept alive: on a connection of its own (the store's calls
have tight timeouts that an idle subscription would trip), subscribed again after a pause
whenever Redis goes away. The admin commands and the shared upstream health both ride it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ballast.resilience.clock import Clock

log = logging.getLogger("ballast.redis")

OnMessage = Callable[[bytes], Awaitable[None]]
OnState = Callable[[bool], Awaitable[None]]


async def listen(
    url: str,
    channel: str,
    clock: Clock,
    on_message: OnMessage,
    on_state: OnState,
    pause: float = 1.0,
    connect_timeout: float = 1.0,
) -> None:
    """Hand every message on `channel` to `on_message`, for ever; `on_state(True)` once each
    subscription is made (the moment to read what was missed), `on_state(False)` when it is
    lost. Cancel the task to stop."""
    import redis.asyncio as redis_asyncio

    subscribed = False
    while True:
        client = redis_asyncio.Redis.from_url(
            url, socket_connect_timeout=connect_timeout, health_check_interval=5
        )
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(channel)
            subscribed = True
            await on_state(True)
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    await on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if subscribed:
                log.warning("Redis channel %s lost (%s)", channel, type(exc).__name__)
                subscribed = False
                await on_state(False)
            await clock.sleep(pause)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

"""Two Ballast instances on one Redis share the actor's run handle: after the idle window,
50 concurrent requests spread over both make exactly one new run; with Redis unreachable
each instance heals on its own."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from ballast.actor.server import ActorServer, start_actor
from tests.stack import Stack, group

pytestmark = pytest.mark.integration

CONTROL = "control-secret-for-tests"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
ANSWER = "".join(f"tok{i} " for i in range(16))


def two_gateways(
    stack: Stack, actor: ActorServer, redis_url: str, tmp_path: Path
) -> list[openai.OpenAI]:
    clients = []
    for n in range(2):
        config = {
            "state": {
                "redis_url": redis_url,
                # Both gateways, the actor and 50 requests share one loop here: under load a
                # turn can outlast the 50 ms default, and an instance that sees Redis as slow
                # rightly makes its own run, a third one (the last test here).
                "redis_timeout": 2.0,
                "database_url": f"sqlite:///{tmp_path / 'shared.db'}",
                "spend_journal": str(tmp_path / f"spend-{n}.journal"),
            },
            "models": [
                group(
                    "sampler",
                    {"id": "actor", "url": actor.url, "api_key": CONTROL, "provider": "actor"},
                )
            ],
        }
        gw = stack.gateway(config)
        clients.append(
            openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-same-client", max_retries=0)
        )
    return clients


def test_two_instances_make_one_run_between_them(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    backend = stack.sim()
    actor = stack.thread.run(
        start_actor(
            backend.url,
            control_secret=CONTROL,
            jwt_secret="j" * 40,
            idle_timeout=0.6,
            shutdown_timeout=0.2,
        )
    )
    clients = two_gateways(stack, actor, redis_url, tmp_path)
    for client in clients:
        assert client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert actor.registry.stats()["created"] == 1  # the second instance adopted the first run
    time.sleep(1.0)  # the run is reclaimed

    def one(n: int) -> str:
        reply = clients[n % 2].chat.completions.create(model="sampler", messages=MESSAGES)
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, range(50)))
    assert answers == [ANSWER] * 50
    assert actor.registry.stats()["created"] == 2


def test_with_redis_unreachable_each_instance_makes_its_own_run(
    stack: Stack, tmp_path: Path
) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = stack.sim()
    actor = stack.thread.run(
        start_actor(backend.url, control_secret=CONTROL, jwt_secret="j" * 40, idle_timeout=60)
    )
    clients = two_gateways(stack, actor, f"redis://127.0.0.1:{port}/0", tmp_path)
    for client in clients:
        reply = client.chat.completions.create(model="sampler", messages=MESSAGES)
        assert reply.choices[0].message.content == ANSWER
    assert actor.registry.stats()["created"] == 2  # nothing to share: one run each

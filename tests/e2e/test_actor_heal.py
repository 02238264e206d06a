"""Seed 000 at small scale: a real actor reclaims idle runs; Ballast heals without the client
noticing (official openai client, real loopback ports)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from ballast.actor.server import ActorServer, start_actor
from ballast.sim.server import SimServer
from tests.stack import Stack, group

CONTROL = "control-secret-for-tests"
JWT_SECRET = "jwt-secret-for-tests-0123456789abcdef"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
ANSWER = "".join(f"tok{i} " for i in range(16))


def start(stack: Stack, backend: SimServer, port: int = 0, **options: float) -> ActorServer:
    actor = stack.thread.run(
        start_actor(
            backend.url,
            port=port,
            control_secret=CONTROL,
            jwt_secret=JWT_SECRET,
            shutdown_timeout=0.2,
            **options,  # type: ignore[arg-type]
        )
    )
    return actor


def gateway(stack: Stack, actor: ActorServer, margin: float = 60.0) -> openai.OpenAI:
    config = {
        "routing": {"handle_refresh_margin": margin},
        "state": {"database_url": "sqlite:///:memory:"},
        "models": [
            group(
                "sampler",
                {"id": "actor", "url": actor.url, "api_key": CONTROL, "provider": "actor"},
            )
        ],
    }
    gw = stack.gateway(config)
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-client-1", max_retries=0)


def created(actor: ActorServer) -> int:
    return actor.registry.stats()["created"]


@pytest.fixture
def backend(stack: Stack) -> SimServer:
    return stack.sim()


def test_idle_reclaim_is_healed_with_one_new_run(stack: Stack, backend: SimServer) -> None:
    actor = start(stack, backend, idle_timeout=0.5, jwt_ttl=60)
    client = gateway(stack, actor)
    first = client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert first.choices[0].message.content == ANSWER
    assert created(actor) == 1
    time.sleep(0.9)  # longer than the actor's idle timeout
    second = client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert second.choices[0].message.content == ANSWER
    assert created(actor) == 2
    assert actor.registry.stats()["reclaimed"] >= 1


def test_fifty_concurrent_requests_after_idle_make_exactly_one_run(
    stack: Stack, backend: SimServer
) -> None:
    actor = start(stack, backend, idle_timeout=0.5, jwt_ttl=60)
    client = gateway(stack, actor)
    client.chat.completions.create(model="sampler", messages=MESSAGES)
    time.sleep(0.9)

    def one(_: int) -> str:
        reply = client.chat.completions.create(model="sampler", messages=MESSAGES)
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, range(50)))
    assert answers == [ANSWER] * 50
    assert created(actor) == 2


def test_other_409_passes_through_unchanged_without_refresh(
    stack: Stack, backend: SimServer
) -> None:
    actor = start(stack, backend)
    client = gateway(stack, actor)
    client.chat.completions.create(model="sampler", messages=MESSAGES)
    stack.set_behaviour(backend, "409?code=session_busy")
    with pytest.raises(openai.ConflictError) as info:
        client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert info.value.code == "session_busy"
    assert created(actor) == 1


def test_persistent_inactive_is_one_refresh_one_retry_then_the_error(
    stack: Stack, backend: SimServer
) -> None:
    actor = start(stack, backend)
    client = gateway(stack, actor)
    client.chat.completions.create(model="sampler", messages=MESSAGES)
    stack.clear_log(backend)
    stack.set_behaviour(backend, "409?code=sampling_run_inactive")
    with pytest.raises(openai.ConflictError) as info:
        client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert info.value.code == "sampling_run_inactive"
    assert created(actor) == 2  # one refresh
    assert len(stack.attempts(backend)) == 2  # one retry, no loop


def test_actor_restart_and_short_tokens_both_heal(stack: Stack, backend: SimServer) -> None:
    actor = start(stack, backend, idle_timeout=60, jwt_ttl=1.5)
    client = gateway(stack, actor, margin=0.5)
    client.chat.completions.create(model="sampler", messages=MESSAGES)
    time.sleep(1.2)  # the token is now inside the refresh margin
    reply = client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert reply.choices[0].message.content == ANSWER
    assert created(actor) == 2
    port = actor.port
    stack.thread.run(actor.close())
    restarted = start(stack, backend, port=port, idle_timeout=60, jwt_ttl=60)
    reply = client.chat.completions.create(model="sampler", messages=MESSAGES)
    assert reply.choices[0].message.content == ANSWER
    assert created(restarted) == 1
    stack.thread.run(restarted.close())


def test_streaming_requests_heal_the_same_way(stack: Stack, backend: SimServer) -> None:
    actor = start(stack, backend, idle_timeout=0.5, jwt_ttl=60)
    client = gateway(stack, actor)
    assert _stream(client) == ANSWER
    time.sleep(0.9)
    assert _stream(client) == ANSWER
    assert created(actor) == 2


def _stream(client: openai.OpenAI) -> str:
    stream = client.chat.completions.create(model="sampler", messages=MESSAGES, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

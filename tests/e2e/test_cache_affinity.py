"""Prompt-cache affinity through the gateway, with the official SDKs, in front of two
simulators that each keep their own prompt cache (one a deployment): a conversation's turns
keep to the deployment that answered it, so every turn after its first reads the previous
turn's prompt from that deployment's cache; without affinity the group's load balancing
spreads the turns and the cache reads fall. A deployment whose breaker opened is passed
over, whatever the conversation preferred."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest

from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group

CONVERSATIONS = 6
TURNS = 4
SPEC = "ok?tokens=5&latency=0.05"  # answers overlap: in-flight counts spread new requests


@pytest.fixture
def sims(stack: Stack) -> tuple[SimServer, SimServer]:
    return stack.sim(SPEC, name="one"), stack.sim(SPEC, name="two")


@pytest.fixture
def gateway(stack: Stack, sims: tuple[SimServer, SimServer]) -> Gateway:
    one, two = sims
    return stack.gateway(
        {
            "routing": {"breaker": {"failure_threshold": 1}},
            "models": [
                group("gpt", deployment("a", one), deployment("b", two)),
                group("gpt-spread", deployment("c", one), deployment("d", two), affinity="off"),
                group(
                    "claude",
                    {**deployment("e", one, provider="anthropic"), "url": one.url},
                    {**deployment("f", two, provider="anthropic"), "url": two.url},
                ),
            ],
        }
    )


def words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m["content"]).split()) for m in messages)


def cached_share(expected: int) -> int:
    """What the simulator reads from its cache, as OpenAI does: from 1,024 tokens, in steps
    of 128."""
    return expected - expected % 128 if expected >= 1024 else 0


class Conversation:
    """One conversation's messages, grown by each turn's question and answer."""

    def __init__(self, number: int, model: str, keyed: bool) -> None:
        system = f"conversation {model} {number}: " + "rule " * 1100
        self.model = model
        self.key = f"{model}-{number}" if keyed else None
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.cached: list[int] = []  # each turn's cached tokens
        self.expected: list[int] = []  # what the previous turn's prompt would give
        self.served: list[str] = []  # the simulator that answered each turn
        self.asked = 0  # the words of the last turn's prompt

    def turn(self, api: openai.OpenAI, number: int) -> None:
        before = self.asked
        self.messages.append({"role": "user", "content": f"turn {number} " + "word " * 300})
        self.asked = words(self.messages)
        extra = {} if self.key is None else {"prompt_cache_key": self.key}
        reply = api.chat.completions.create(model=self.model, messages=self.messages, **extra)  # type: ignore[call-overload]
        assert reply.usage is not None
        details = reply.usage.prompt_tokens_details
        self.cached.append(details.cached_tokens or 0 if details is not None else 0)
        self.expected.append(cached_share(before))
        self.served.append(reply.system_fingerprint)
        self.messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-none", max_retries=0)


def converse(gateway: Gateway, model: str) -> list[Conversation]:
    """Conversations of TURNS turns, half named by a `prompt_cache_key`, half by their
    prompt; each turn of every conversation at once."""
    talks = [Conversation(n, model, keyed=n % 2 == 0) for n in range(CONVERSATIONS)]
    with client(gateway) as api, ThreadPoolExecutor(CONVERSATIONS) as pool:
        for number in range(1, TURNS + 1):
            list(pool.map(Conversation.turn, talks, [api] * len(talks), [number] * len(talks)))
    return talks


def test_a_conversation_reads_its_prompt_from_the_cache_of_the_deployment_it_kept_to(
    gateway: Gateway,
) -> None:
    talks = converse(gateway, "gpt")
    for talk in talks:
        assert len(set(talk.served)) == 1  # every turn on the deployment of its first
        assert talk.cached[0] == 0
        assert talk.cached[1:] == talk.expected[1:]  # the previous turn's prompt, read
        assert all(cached > 1024 for cached in talk.cached[2:])
    assert {talk.served[0] for talk in talks} == {"sim:one", "sim:two"}  # still spread
    kept = sum(sum(talk.cached) for talk in talks)

    spread = converse(gateway, "gpt-spread")
    moved = sum(len(set(talk.served)) > 1 for talk in spread)
    assert moved >= 1  # load balancing alone moves conversations between deployments
    assert sum(sum(talk.cached) for talk in spread) < kept


def test_a_deployment_whose_breaker_opened_is_passed_over(
    gateway: Gateway, stack: Stack, sims: tuple[SimServer, SimServer]
) -> None:
    api = client(gateway)
    talks = [Conversation(n, "gpt", keyed=True) for n in range(5)]
    with ThreadPoolExecutor(5) as pool:
        list(pool.map(lambda talk: talk.turn(api, 1), talks))
    # Five conversations on two deployments: one of them holds at least two.
    crowded = max(("sim:one", "sim:two"), key=lambda s: sum(t.served[0] == s for t in talks))
    held = [talk for talk in talks if talk.served[0] == crowded]
    victim = sims[0] if crowded == "sim:one" else sims[1]
    assert len(held) >= 2
    stack.set_behaviour(victim, "500")
    held[0].turn(api, 2)  # fails there, opens its breaker, and is answered by the other
    assert held[0].served[1] != crowded
    assert stack.attempts(victim)[-1]["outcome"] == "500"
    stack.clear_log(victim)
    stack.set_behaviour(victim, SPEC)
    for talk in held[1:]:
        talk.turn(api, 2)  # preferred the open one: answered at once by the other
        assert talk.served[1] != crowded
    assert stack.attempts(victim) == []  # not even tried
    breaker = gateway.router.targets["a" if crowded == "sim:one" else "b"].breaker
    assert breaker.state.value == "open"
    api.close()


def test_messages_keep_to_a_deployment_by_metadata_user_id(gateway: Gateway) -> None:
    """Anthropic's cache is the marked system prompt: every request of one conversation
    after its first reads it, from the deployment that wrote it."""
    system: Any = [{"type": "text", "text": "rule " * 40, "cache_control": {"type": "ephemeral"}}]
    reads = []
    api = anthropic.Anthropic(base_url=gateway.url, api_key="sk-none", max_retries=0)
    for _ in range(6):
        reply = api.messages.create(
            model="claude",
            max_tokens=10,
            system=system,
            metadata={"user_id": "user-1"},
            messages=[{"role": "user", "content": "hello"}],
        )
        reads.append(reply.usage.cache_read_input_tokens)
    api.close()
    assert reads == [0, 40, 40, 40, 40, 40]

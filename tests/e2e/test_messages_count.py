"""`POST /v1/messages/count_tokens` with the official `anthropic` SDK: a group with an Anthropic
deployment served natively gets the provider's own count (the simulator's, exact), asked with
the deployment's key and model name and the client's version and betas; anything else, or an
upstream that fails, gets the gateway's estimate, and the answer says which it is."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group

SYSTEM = "You are a careful assistant."
HI: list[Any] = [{"role": "user", "content": "hello there, how are you"}]
BETA = "token-counting-2024-11-01"
WORDS = 10  # the simulator counts the words of the system prompt and the messages


def native(dep_id: str, sim: SimServer, **extra: Any) -> dict[str, Any]:
    entry = deployment(dep_id, sim, model="claude-sim", provider="anthropic", **extra)
    return {**entry, "url": sim.url}


@pytest.fixture
def gateway(stack: Stack, sim: SimServer) -> Gateway:
    return stack.gateway(
        {
            "models": [
                group("claude", native("a", sim)),
                group("bridged", deployment("chat", sim, model="sim-chat")),
                # A chat deployment ranked first: the count still goes to the one that has it.
                group("mixed", deployment("m1", sim), native("m2", sim), strategy="ordered"),
                group("claude-bridged", native("b", sim, messages="bridge")),
            ]
        }
    )


def api(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="sk-none", max_retries=0, timeout=20)


def count(gateway: Gateway, model: str, **extra: Any) -> tuple[int, str, str | None]:
    with api(gateway) as client:
        raw = client.messages.with_raw_response.count_tokens(
            model=model, system=SYSTEM, messages=HI, **extra
        )
    return (
        raw.parse().input_tokens,
        raw.headers["x-ballast-count"],
        raw.headers.get("x-ballast-deployment"),
    )


def test_a_native_deployment_counts_with_its_own_key_model_and_the_clients_headers(
    gateway: Gateway, stack: Stack, sim: SimServer
) -> None:
    tokens, source, deployed = count(
        gateway,
        "claude",
        extra_headers={"anthropic-beta": BETA},
        extra_body={"fallbacks": ["bridged"]},  # Ballast's own: not sent upstream
    )
    assert (tokens, source, deployed) == (WORDS, "upstream", "a")
    (asked,) = stack.attempts(sim)
    assert asked["path"] == "/v1/messages/count_tokens"
    assert asked["model"] == "claude-sim"  # the deployment's name for it
    assert asked["fields"] == ["messages", "model", "system"]
    assert asked["headers"]["x-api-key"] == "***cret"  # the deployment's key, sk-a-secret
    assert asked["headers"]["anthropic-beta"] == BETA
    assert asked["headers"]["anthropic-version"]  # the SDK's own
    # The count is what a message with the same body reports as its input.
    with api(gateway) as client:
        reply = client.messages.create(model="claude", max_tokens=5, system=SYSTEM, messages=HI)
    assert reply.usage.input_tokens == tokens


def test_a_group_mixing_chat_and_native_deployments_asks_the_native_one(
    gateway: Gateway, stack: Stack, sim: SimServer
) -> None:
    assert count(gateway, "mixed") == (WORDS, "upstream", "m2")
    assert [a["path"] for a in stack.attempts(sim)] == ["/v1/messages/count_tokens"]


@pytest.mark.parametrize("model", ["bridged", "claude-bridged"])
def test_without_a_native_count_the_answer_is_the_estimate(
    gateway: Gateway, stack: Stack, sim: SimServer, model: str
) -> None:
    tokens, source, deployed = count(gateway, model)
    assert source == "estimate" and deployed is None
    assert tokens > WORDS  # bytes / 4 of the chat form: it errs high
    assert stack.attempts(sim) == []


@pytest.mark.parametrize("fault", ["500", "429", "503"])
def test_a_failing_upstream_gets_the_estimate(
    gateway: Gateway, stack: Stack, sim: SimServer, fault: str
) -> None:
    stack.set_behaviour(sim, fault)
    tokens, source, _ = count(gateway, "claude")
    assert source == "estimate" and tokens > WORDS
    assert [a["outcome"] for a in stack.attempts(sim)] == [fault]
    # Not a verdict on its health: its breaker stays closed, its next count is its own.
    assert gateway.router.targets["a"].breaker.state.value == "closed"
    stack.set_behaviour(sim, "ok")
    assert count(gateway, "claude")[:2] == (WORDS, "upstream")


def test_an_open_breaker_is_not_asked(gateway: Gateway, stack: Stack, sim: SimServer) -> None:
    gateway.router.targets["a"].breaker.force_open(60.0)
    assert count(gateway, "claude")[1] == "estimate"
    assert stack.attempts(sim) == []


def test_the_upstreams_refusal_of_the_body_reaches_the_client(gateway: Gateway) -> None:
    with api(gateway) as client, pytest.raises(anthropic.BadRequestError) as info:
        client.messages.count_tokens(model="claude", messages=[])
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "at least one message" in info.value.body["error"]["message"]  # type: ignore[index]

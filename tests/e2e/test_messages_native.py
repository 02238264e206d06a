"""Messages passed through to a deployment that speaks it, with the official `anthropic` SDK
against the simulator's strict Anthropic wire: the client's body and betas reach the
upstream as sent, its thinking signatures and cache figures reach the client exactly, spend
counts the cache as the provider bills it, and a group mixing native and bridged deployments
fails over across them before the first byte. Where a translation must leave something out,
the client is told (`x-ballast-dropped`), or refused where the group is strict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ballast.sim.agent import THINKING_TEXT, sign
from ballast.sim.server import SimServer
from tests.e2e.test_observe import scrape, value
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MASTER = "sk-master-for-native-messages-0123"
HI: list[Any] = [{"role": "user", "content": "hello there"}]
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
# A long system prompt, cached: its words are what the simulator's cache writes, then reads.
SYSTEM: Any = [{"type": "text", "text": "rule " * 40, "cache_control": {"type": "ephemeral"}}]
BETA = "context-management-2025-06-27,interleaved-thinking-2025-05-14"
PRICE = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}


def anthropic_dep(dep_id: str, sim: SimServer, **extra: Any) -> dict[str, Any]:
    entry = deployment(dep_id, sim, model="claude-sim", provider="anthropic", **extra)
    return {**entry, "url": sim.url}


def api(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=MASTER, max_retries=0, timeout=20)


@pytest.fixture
def native(stack: Stack, tmp_path: Path) -> tuple[SimServer, Gateway]:
    sim = stack.sim("ok?tokens=5", name="claude")
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path),
            "prices": {"claude-sim": PRICE},
            "models": [group("claude", anthropic_dep("a", sim))],
        }
    )
    return sim, gateway


def test_the_body_and_betas_go_as_sent_and_signatures_and_cache_figures_come_back(
    stack: Stack, native: tuple[SimServer, Gateway]
) -> None:
    sim, gateway = native
    asked: Any = {
        "model": "claude",
        "max_tokens": 100,
        "messages": HI,
        "system": SYSTEM,
        "thinking": THINKING,
        "extra_headers": {"anthropic-beta": BETA},
        "extra_body": {"context_management": {"edits": []}},
    }
    raw = api(gateway).messages.with_raw_response.create(**asked)
    first = raw.parse()
    assert "x-ballast-dropped" not in raw.headers
    assert first.id == "msg_sim_1" and first.model == "claude-sim"
    thinking, text = first.content
    assert thinking.type == "thinking" and thinking.signature == sign(THINKING_TEXT)
    assert text.type == "text" and text.text == "tok0 tok1 tok2 tok3 tok4 "
    assert first.usage.cache_creation_input_tokens == 40
    assert first.usage.cache_read_input_tokens == 0
    with api(gateway).messages.stream(**asked) as stream:
        second = stream.get_final_message()
    assert second.content[0].type == "thinking"
    assert second.content[0].signature == sign(THINKING_TEXT)
    assert second.usage.cache_read_input_tokens == 40
    assert second.usage.cache_creation_input_tokens == 0
    attempts = stack.attempts(sim)
    assert [a["stream"] for a in attempts] == [False, True]
    for attempt in attempts:
        assert attempt["model"] == "claude-sim"  # the deployment's name for it
        assert "context_management" in attempt["fields"] and "thinking" in attempt["fields"]
        assert attempt["headers"]["anthropic-beta"] == BETA
        assert attempt["headers"]["anthropic-version"]  # the SDK's own
    # Spend: the input tokens are the provider's three figures, the cache's reads and writes
    # at their own prices.
    samples = scrape(gateway)
    usages = [first.usage, second.usage]
    prompt = sum(
        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens for u in usages
    )
    output = sum(u.output_tokens for u in usages)
    labels = {"model": "claude", "deployment": "a", "shape": "anthropic"}
    assert value(samples, "ballast_tokens_total", type="input", **labels) == prompt
    assert value(samples, "ballast_tokens_total", type="output", **labels) == output
    read = sum(u.cache_read_input_tokens for u in usages)
    written = sum(u.cache_creation_input_tokens for u in usages)
    fresh = prompt - read - written
    expected = (fresh * 3.0 + read * 0.3 + written * 3.75 + output * 15.0) / 1_000_000
    assert value(samples, "ballast_cost_dollars_total", **labels) == pytest.approx(expected)


def test_a_tool_turn_with_its_signed_thinking_passes_and_an_altered_one_is_refused(
    native: tuple[SimServer, Gateway],
) -> None:
    _, gateway = native
    use = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}

    def turn(block: dict[str, Any]) -> list[Any]:
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}
        return [
            *HI,
            {"role": "assistant", "content": [block, use]},
            {"role": "user", "content": [result]},
        ]

    signed = {"type": "thinking", "thinking": THINKING_TEXT, "signature": sign(THINKING_TEXT)}
    ok = api(gateway).messages.create(
        model="claude", max_tokens=100, messages=turn(signed), thinking=THINKING
    )
    assert ok.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        api(gateway).messages.create(
            model="claude",
            max_tokens=100,
            messages=turn({**signed, "signature": "forged"}),
            thinking=THINKING,
        )


@pytest.mark.parametrize("first", ["native", "bridged"])
def test_a_group_mixing_native_and_bridged_deployments_fails_over_across_them(
    stack: Stack, first: str
) -> None:
    claude = stack.sim("ok?tokens=3", name="claude")
    chat = stack.sim("ok?tokens=3", name="chat")
    if first == "native":
        claude = stack.sim("500", name="claude-down")
    else:
        chat = stack.sim("500", name="chat-down")
    deployments = [anthropic_dep("n", claude), deployment("b", chat, model="sim-chat")]
    if first == "bridged":
        deployments.reverse()
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "models": [group("claude", *deployments, strategy="ordered")],
        }
    )
    with api(gateway).messages.stream(model="claude", max_tokens=50, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 " and final.stop_reason == "end_turn"
    whole = api(gateway).messages.create(model="claude", max_tokens=50, messages=HI)
    assert whole.content[0].type == "text" and whole.content[0].text == "tok0 tok1 tok2 "
    answered = chat if first == "native" else claude
    assert [a["outcome"] for a in stack.attempts(answered)] == ["ok", "ok"]


def test_what_a_translation_leaves_out_is_named_or_refused_where_the_group_is_strict(
    stack: Stack,
) -> None:
    sim = stack.sim("ok?tokens=2")
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "models": [
                group("chat", deployment("a", sim)),
                group("strict", deployment("s", sim), strict_params=True),
            ],
        }
    )
    extra: Any = {"context_management": {"edits": []}}
    raw = api(gateway).messages.with_raw_response.create(
        model="chat", max_tokens=50, messages=HI, thinking=THINKING, extra_body=extra
    )
    assert raw.headers["x-ballast-dropped"] == "context_management,thinking"
    assert raw.parse().content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError, match="context_management"):
        api(gateway).messages.create(model="strict", max_tokens=50, messages=HI, extra_body=extra)
    responses = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER, max_retries=0)
    answered = responses.responses.with_raw_response.create(
        model="chat", input="hi", extra_body={"client_metadata": {"thread": "t"}}
    )
    assert answered.headers["x-ballast-dropped"] == "client_metadata"
    assert answered.parse().status == "completed"
    samples = scrape(gateway)
    dropped = "ballast_dropped_params_total"
    assert value(samples, dropped, shape="anthropic", parameter="thinking") == 1
    assert value(samples, dropped, shape="responses", parameter="client_metadata") == 1

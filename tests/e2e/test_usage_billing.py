"""Usage and money that match the provider's bill, on every inbound shape and provider pair,
streamed and not: an answer that read the prompt cache, wrote to it (for 5 minutes and for
an hour) and reasoned reaches the client with the provider's figures in the shape's own usage
fields, and its spend event, metrics and request log hold those figures, the spend being
the provider's reported usage times the configured prices (to 1 %).

The simulator bills each answer alike (`cache_read`, `cache_write`, `cache_write_1h`,
`thinking`) and reports it as its provider does, which is not alike: Anthropic and Bedrock
count the cache outside `input_tokens`, Gemini reports no writes and its thoughts apart from
its candidates, Bedrock neither the hour-long writes nor the reasoning. The figures the test
expects are read from what the simulator logged it reported, in the provider's own words,
independently of Ballast's reader. One gateway serves the whole module; each request comes
with a key of its own, so its spend, metrics and log lines are its alone."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anthropic
import openai
import pytest

from ballast.observe.logs import JsonFormatter
from ballast.sim.server import SimServer
from tests.e2e.test_access import MASTER, new_key
from tests.e2e.test_observe import scrape, value
from tests.stack import Gateway, Stack, deployment, group, sqlite_state, wait_for

# Dollars per million tokens: every rate apart, so a token priced at the wrong one shows.
PRICE = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}
PRICE_1H = 6.0
BILLED = "ok?tokens=5&cache_read=20&cache_write=12&cache_write_1h=6&thinking=7"
AWS = {"region": "eu-west-1"}
WORDS = "word " * 60  # the prompt: long enough to hold every cache figure above
MODELS = {
    "openai": "sim-gpt",
    "azure": "sim-azure",
    "anthropic": "claude-sim",
    "gemini": "gemini-sim",
    "bedrock": "anthropic.claude-sim-v1:0",
}


class Figures(NamedTuple):
    """One answer as billed: prompt and completion, and their parts."""

    prompt: int
    completion: int
    cached: int
    written: int
    written_1h: int
    reasoning: int

    def cost(self) -> float:
        fresh = self.prompt - self.cached - self.written
        dollars = fresh * PRICE["input"] + self.cached * PRICE["cached_input"]
        dollars += (self.written - self.written_1h) * PRICE["cache_write"]
        dollars += self.written_1h * PRICE_1H + self.completion * PRICE["output"]
        return dollars / 1_000_000


def reported(provider: str, usage: dict[str, Any]) -> Figures:
    """The provider's usage, in its own words, as the figures it bills."""
    if provider == "gemini":
        thoughts = usage.get("thoughtsTokenCount", 0)
        completion = usage["candidatesTokenCount"] + thoughts
        cached = usage.get("cachedContentTokenCount", 0)
        return Figures(usage["promptTokenCount"], completion, cached, 0, 0, thoughts)
    if provider == "bedrock":
        read, write = usage.get("cacheReadInputTokens", 0), usage.get("cacheWriteInputTokens", 0)
        prompt = usage["inputTokens"] + read + write
        return Figures(prompt, usage["outputTokens"], read, write, 0, 0)
    if "cache_read_input_tokens" in usage:  # Anthropic's
        read, write = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        prompt = usage["input_tokens"] + read + write
        long = usage.get("cache_creation", {}).get("ephemeral_1h_input_tokens", 0)
        thinking = usage.get("output_tokens_details", {}).get("thinking_tokens", 0)
        return Figures(prompt, usage["output_tokens"], read, write, long, thinking)
    if "input_tokens" in usage:  # a Response's
        details, output = usage["input_tokens_details"], usage["output_tokens_details"]
        return Figures(
            usage["input_tokens"],
            usage["output_tokens"],
            details["cached_tokens"],
            details["cache_write_tokens"],
            0,
            output["reasoning_tokens"],
        )
    details = usage.get("prompt_tokens_details", {})
    output = usage.get("completion_tokens_details", {})
    return Figures(
        usage["prompt_tokens"],
        usage["completion_tokens"],
        details.get("cached_tokens", 0),
        details.get("cache_write_tokens", 0),
        0,
        output.get("reasoning_tokens", 0),
    )


class Served(NamedTuple):
    stack: Stack
    sim: SimServer
    gateway: Gateway
    folder: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("billing")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "AKIDBILLING")
        env.setenv("AWS_SECRET_ACCESS_KEY", "billing-secret")
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
            env.delenv(name, raising=False)
        stack = Stack()
        try:
            sim = stack.sim(BILLED)
            gateway = stack.gateway(_config(sim, folder))
            yield Served(stack, sim, gateway, folder)
        finally:
            stack.close()


def _config(sim: SimServer, folder: Path) -> dict[str, Any]:
    native = {"url": sim.url, "api_key": "sk-native-secret"}
    groups = [
        group("openai", deployment("openai", sim, model=MODELS["openai"], responses="native")),
        group(
            "azure",
            {
                **deployment("azure", sim, model=MODELS["azure"], provider="azure"),
                "url": sim.url + "/openai",
                "azure": {"api_version": "2024-10-21"},
            },
        ),
        group("anthropic", {**deployment("anthropic", sim, provider="anthropic"), **native}),
        group("gemini", {**deployment("gemini", sim, provider="gemini"), **native}),
        group("bedrock", {"id": "bedrock", "url": sim.url, "provider": "bedrock", "aws": AWS}),
        group("marks", {**deployment("marks", sim, provider="anthropic"), **native}),
    ]
    for entry in groups:
        name = entry["name"]
        entry["deployments"][0]["model"] = MODELS.get(name, "claude-marks")
    prices = {model: {**PRICE, "cache_write_1h": PRICE_1H} for model in MODELS.values()}
    prices["claude-marks"] = {**PRICE, "cache_write_1h": PRICE_1H}
    return {
        "server": {"master_key": MASTER},
        "state": sqlite_state(folder, spend_flush_interval=0.05),
        "prices": prices,
        "models": groups,
    }


def _chat(gateway: Gateway, key: str, provider: str, stream: bool) -> Any:
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=20)
    messages: Any = [{"role": "user", "content": WORDS}]
    if not stream:
        return api.chat.completions.create(model=provider, messages=messages).usage
    chunks = api.chat.completions.create(
        model=provider, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    (usage,) = [chunk.usage for chunk in chunks if chunk.usage is not None]
    return usage


def _responses(gateway: Gateway, key: str, provider: str, stream: bool) -> Any:
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=20)
    if not stream:
        return api.responses.create(model=provider, input=WORDS).usage
    with api.responses.stream(model=provider, input=WORDS) as events:
        return events.get_final_response().usage


def _messages(gateway: Gateway, key: str, provider: str, stream: bool) -> Any:
    api = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=20)
    asked: Any = {"model": provider, "max_tokens": 100}
    asked["messages"] = [{"role": "user", "content": WORDS}]
    if not stream:
        return api.messages.create(**asked).usage
    split = None
    with api.messages.stream(**asked) as events:
        for event in events:
            if event.type == "message_delta":
                split = (event.usage.model_extra or {}).get("cache_creation", split)
        usage = events.get_final_message().usage
    if usage.cache_creation is None and split is not None:
        # A bridged stream learns the cache's figures at its end: its message_delta says
        # them (the SDK keeps the split of message_start only).
        usage.cache_creation = anthropic.types.CacheCreation.model_validate(split)
    return usage


def _check_openai(usage: Any, expected: Figures) -> None:
    assert (usage.prompt_tokens, usage.completion_tokens) == expected[:2]
    details = usage.prompt_tokens_details
    assert details.cached_tokens == expected.cached
    assert (details.cache_write_tokens or 0) == expected.written
    assert (details.model_extra or {}).get("cache_write_1h_tokens", 0) == expected.written_1h
    reasoning = usage.completion_tokens_details
    assert (reasoning.reasoning_tokens if reasoning else 0) == expected.reasoning


def _check_responses(usage: Any, expected: Figures) -> None:
    assert (usage.input_tokens, usage.output_tokens) == expected[:2]
    assert usage.total_tokens == expected.prompt + expected.completion
    details = usage.input_tokens_details
    assert (details.cached_tokens, details.cache_write_tokens) == expected[2:4]
    assert (details.model_extra or {}).get("cache_write_1h_tokens", 0) == expected.written_1h
    assert usage.output_tokens_details.reasoning_tokens == expected.reasoning


def _check_messages(usage: Any, expected: Figures) -> None:
    fresh = expected.prompt - expected.cached - expected.written
    assert (usage.input_tokens, usage.output_tokens) == (fresh, expected.completion)
    assert usage.cache_read_input_tokens == expected.cached
    assert usage.cache_creation_input_tokens == expected.written
    split = usage.cache_creation
    assert split.ephemeral_1h_input_tokens == expected.written_1h
    assert split.ephemeral_5m_input_tokens == expected.written - expected.written_1h
    thinking = usage.output_tokens_details
    assert (thinking.thinking_tokens if thinking else 0) == expected.reasoning


SHAPES = {
    "chat": (_chat, _check_openai),
    "responses": (_responses, _check_responses),
    "messages": (_messages, _check_messages),
}


def spend_row(folder: Path, key_id: str) -> tuple[Any, ...]:
    query = (
        "SELECT prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens,"
        " cache_write_1h_tokens, reasoning_tokens, cost FROM spend_events WHERE key_id = ?"
    )
    with sqlite3.connect(folder / "ballast.db") as db:
        rows = list(db.execute(query, (key_id,)))
    assert len(rows) <= 1
    return tuple(rows[0]) if rows else ()


def log_line(caplog: pytest.LogCaptureFixture, key_id: str) -> dict[str, Any] | None:
    for record in caplog.records:
        if record.name == "ballast.access":
            line: dict[str, Any] = json.loads(JsonFormatter().format(record))
            if line.get("key_id") == key_id:
                return line
    return None


def assert_billed(
    served: Served, caplog: pytest.LogCaptureFixture, key_id: str, expected: Figures
) -> None:
    """The key's one answer, in spend, metrics and the request log, as the provider billed
    it; its cost the provider's figures times the prices."""
    wait_for(lambda: spend_row(served.folder, key_id))
    *tokens, cost = spend_row(served.folder, key_id)
    assert tuple(tokens) == expected
    assert cost == pytest.approx(expected.cost(), rel=0.01)
    wait_for(lambda: log_line(caplog, key_id))  # the request has ended: metrics are taken
    line = log_line(caplog, key_id)
    assert line is not None
    logged = [
        line[name]
        for name in (
            "input_tokens",
            "output_tokens",
            "cached_tokens",
            "cache_write_tokens",
            "cache_write_1h_tokens",
            "reasoning_tokens",
        )
    ]
    assert logged == list(expected)
    assert line["cost"] == pytest.approx(expected.cost(), rel=0.01)
    samples = scrape(served.gateway)
    for kind, count in zip(
        ("input", "output", "cached", "cache_write", "cache_write_1h", "reasoning"),
        expected,
        strict=True,
    ):
        assert value(samples, "ballast_tokens_total", key_id=key_id, type=kind) == count, kind
    dollars = value(samples, "ballast_cost_dollars_total", key_id=key_id)
    assert dollars == pytest.approx(expected.cost(), rel=0.01)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("provider", list(MODELS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_spend_is_the_providers_usage_times_the_prices(
    served: Served, caplog: pytest.LogCaptureFixture, shape: str, provider: str, stream: bool
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    key, key_id = new_key(served.gateway)
    ask, check = SHAPES[shape]
    usage = ask(served.gateway, key, provider, stream)
    (attempt,) = [a for a in served.stack.attempts(served.sim) if a.get("usage")][-1:]
    assert attempt["model"] == MODELS[provider] and attempt["stream"] in (stream, True)
    expected = reported(provider, attempt["usage"])
    # Each provider reports what it bills, no more: the figures a test of its own wire holds.
    assert expected.cached == 20 and expected.completion == 5 + 7
    assert expected.written == (0 if provider == "gemini" else 12 + 6)
    assert expected.written_1h == (6 if provider == "anthropic" else 0)
    assert expected.reasoning == (0 if provider == "bedrock" else 7)
    check(usage, expected)
    assert_billed(served, caplog, key_id, expected)


def test_anthropic_cache_marks_write_for_an_hour_and_are_read_across_shapes(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """The simulator's prompt cache driven by the client's own marks: a chat request's
    system prompt marked for an hour is written for an hour; a Messages request that shares
    it and marks one more block reads the first and writes the second for 5 minutes."""
    caplog.set_level(logging.INFO, logger="ballast.access")
    served.stack.set_behaviour(served.sim, "ok?tokens=5&thinking=3", "claude-marks")
    hour: Any = {"type": "ephemeral", "ttl": "1h"}
    first = {"type": "text", "text": "rule " * 30, "cache_control": hour}
    second = {"type": "text", "text": "more " * 10, "cache_control": {"type": "ephemeral"}}
    hi = "hello there"

    key, key_id = new_key(served.gateway)
    api = openai.OpenAI(base_url=served.gateway.url + "/v1", api_key=key, max_retries=0)
    messages: Any = [{"role": "system", "content": [first]}, {"role": "user", "content": hi}]
    chat = api.chat.completions.create(model="marks", messages=messages).usage
    prompt = 30 + 2
    expected = Figures(prompt, 5 + 3, 0, 30, 30, 3)
    assert reported("anthropic", served.stack.attempts(served.sim)[-1]["usage"]) == expected
    _check_openai(chat, expected)
    assert_billed(served, caplog, key_id, expected)

    key, key_id = new_key(served.gateway)
    client = anthropic.Anthropic(base_url=served.gateway.url, api_key=key, max_retries=0)
    asked: Any = {"model": "marks", "max_tokens": 100, "system": [first, second]}
    with client.messages.stream(**asked, messages=[{"role": "user", "content": hi}]) as events:
        usage = events.get_final_message().usage
    expected = Figures(prompt + 10, 5 + 3, 30, 10, 0, 3)
    assert reported("anthropic", served.stack.attempts(served.sim)[-1]["usage"]) == expected
    _check_messages(usage, expected)
    assert_billed(served, caplog, key_id, expected)

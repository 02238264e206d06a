"""Azure OpenAI deployments (both URL styles) and OpenAI-compatible presets behind Ballast,
through the official openai SDK against the simulator."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from ballast.config import ConfigError, parse_settings
from tests.e2e.test_routing import FAST, full
from tests.stack import Gateway, Stack, group

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
]


def azure(dep_id: str, url: str, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": dep_id, "url": url, "api_key": f"az-{dep_id}-key"}
    entry.update(provider="azure", model="gpt-4o", azure=options)
    return entry


def gateway_for(stack: Stack, *deployments: dict[str, Any]) -> Gateway:
    config = {"timeouts": FAST, "models": [group("chat", *deployments, strategy="ordered")]}
    return stack.gateway(config)


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)


@pytest.mark.parametrize(
    "options",
    [
        {"api_version": "2024-10-21", "deployment": "gpt4o-prod"},
        {"style": "v1"},
        {"api_version": "2024-10-21", "auth": "bearer"},
    ],
    ids=["classic", "v1", "classic-bearer"],
)
def test_azure_chat_streamed_and_not_and_a_tool_call(stack: Stack, options: dict[str, Any]) -> None:
    sim = stack.sim()
    api = client(gateway_for(stack, azure("az", sim.url + "/openai", **options)))
    reply = api.chat.completions.create(model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content == full(16)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert text == full(16)
    stack.set_behaviour(sim, "ok?shape=tool&tokens=2")
    called = api.chat.completions.create(model="chat", messages=MESSAGES, tools=TOOLS)
    (call,) = called.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"q": "tok0 tok1 "}  # type: ignore[union-attr]
    attempts = stack.attempts(sim)
    style = options.get("style", "deployments")
    name = options.get("deployment", "gpt-4o")
    expected = (
        "/openai/v1/chat/completions"
        if style == "v1"
        else f"/openai/deployments/{name}/chat/completions"
    )
    assert {a["path"] for a in attempts} == {expected}
    if options.get("auth") == "bearer":
        assert all(a["headers"]["authorization"] == "***-key" for a in attempts)
    else:
        assert all(a["headers"]["api-key"] == "***-key" for a in attempts)
        assert all("authorization" not in a["headers"] for a in attempts)


def test_azure_content_filter_reaches_the_client_and_rate_limits_fail_over(stack: Stack) -> None:
    limited, filtering = stack.sim("429?retry_after=30", name="l"), stack.sim("content_filter")
    api = client(
        gateway_for(
            stack,
            azure("limited", limited.url, api_version="2024-10-21"),
            azure("filtering", filtering.url, api_version="2024-10-21"),
        )
    )
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model="chat", messages=MESSAGES)
    assert info.value.code == "content_filter"
    assert len(stack.attempts(limited)) == 1 and len(stack.attempts(filtering)) == 1


def test_azure_settings_are_checked_at_load() -> None:
    classic = {"models": [group("chat", azure("az", "https://r.openai.azure.com"))]}
    with pytest.raises(ConfigError, match=r"azure\.api_version is required"):
        parse_settings(classic)
    unnamed = azure("az", "https://r.openai.azure.com", api_version="2024-10-21")
    unnamed.pop("model")
    with pytest.raises(ConfigError, match=r"azure\.deployment \(or model\) is required"):
        parse_settings({"models": [group("chat", unnamed)]})
    wrong = azure("az", "https://r.openai.azure.com", style="v2")
    with pytest.raises(ConfigError, match="style"):
        parse_settings({"models": [group("chat", wrong)]})


def test_a_preset_fills_the_url_and_an_explicit_one_wins(stack: Stack) -> None:
    filled = parse_settings(
        {"models": [group("chat", {"id": "m", "provider": "mistral", "api_key": "k"})]}
    )
    assert filled.models[0].deployments[0].url == "https://api.mistral.ai/v1"
    groq = parse_settings({"models": [group("chat", {"id": "g", "provider": "groq"})]})
    assert groq.models[0].deployments[0].url == "https://api.groq.com/openai/v1"
    with pytest.raises(ConfigError, match="url"):
        parse_settings({"models": [group("chat", {"id": "o", "provider": "openai"})]})
    sim = stack.sim()
    mistral = {"id": "m", "provider": "mistral", "url": sim.url + "/v1", "api_key": "k"}
    api = client(gateway_for(stack, mistral))
    chunks = list(
        api.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full(16)
    # Mistral refuses stream_options: it was left out, so the simulator sent no usage chunk.
    assert not any(c.usage for c in chunks)
    assert len(stack.attempts(sim)) == 1


def test_every_preset_is_a_provider_name_and_an_unknown_one_is_named() -> None:
    from typing import get_args

    from ballast.config import PRESETS, ProviderName
    from ballast.providers import ADAPTERS

    assert set(PRESETS) <= set(get_args(ProviderName)) == set(ADAPTERS)
    with pytest.raises(ConfigError) as info:
        parse_settings(
            {"models": [group("chat", {"id": "p", "provider": "nope", "url": "http://x"})]}
        )
    (error,) = info.value.errors
    assert error.startswith("models[0].deployments[0].provider:") and "'mistral'" in error

"""The simulator on Azure OpenAI's URLs, read by the official SDK: `openai.AzureOpenAI` on
the classic deployments paths (with an api-key and with a bearer token), and the OpenAI
client on the `/openai/v1/` API, as Azure documents it."""

from __future__ import annotations

import openai
import pytest

from tests.stack import Stack

TEXT = "".join(f"tok{i} " for i in range(16))


def test_classic_paths_with_an_api_key_and_a_token(stack: Stack) -> None:
    sim = stack.sim()
    keyed = openai.AzureOpenAI(
        azure_endpoint=sim.url, api_key="az-key-1234", api_version="2024-10-21", max_retries=0
    )
    reply = keyed.chat.completions.create(
        model="gpt-4o-dep", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == TEXT
    stream = keyed.chat.completions.create(
        model="gpt-4o-dep", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == TEXT
    token = openai.AzureOpenAI(
        azure_endpoint=sim.url,
        azure_ad_token="entra-token",
        api_version="2024-10-21",
        max_retries=0,
    )
    assert token.embeddings.create(model="embed-dep", input="x").data
    first, streamed, third = stack.attempts(sim)
    assert streamed["stream"] is True
    assert first["path"] == "/openai/deployments/gpt-4o-dep/chat/completions"
    assert first["headers"]["api-key"] == "***1234"
    assert third["headers"]["authorization"].endswith("oken")


def test_the_v1_api(stack: Stack) -> None:
    sim = stack.sim()
    client = openai.OpenAI(
        base_url=sim.url + "/openai/v1",
        api_key="unused",
        default_headers={"api-key": "az-key-1234"},
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == TEXT and reply.model == "gpt-4o"


def test_azure_refusals(stack: Stack) -> None:
    sim = stack.sim()
    missing_version = openai.OpenAI(
        base_url=sim.url + "/openai/deployments/dep", api_key="k", max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        missing_version.chat.completions.create(
            model="dep", messages=[{"role": "user", "content": "hi"}]
        )
    keyed = openai.AzureOpenAI(
        azure_endpoint=sim.url, api_key="k", api_version="2024-10-21", max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as info:
        keyed.chat.completions.create(
            model="dep",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-behaviour": "content_filter"},
        )
    assert info.value.code == "content_filter"

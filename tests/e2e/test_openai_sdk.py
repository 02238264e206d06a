"""The official openai SDK through the gateway, for every endpoint, streamed and not."""

from __future__ import annotations

import time

import openai
import pytest

from tests.stack import Stack, deployment, group


@pytest.fixture
def gateway_url(stack: Stack) -> str:
    sim = stack.sim()
    config = {
        "models": [
            group("chat", deployment("a", sim, model="sim-chat")),
            group("embed", deployment("e", sim)),
        ]
    }
    return stack.gateway(config).url


def test_sync_chat(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello there"}]
    )
    assert reply.choices[0].message.content == "".join(f"tok{i} " for i in range(16))
    assert reply.model == "sim-chat"  # the model that actually answered
    assert reply.usage is not None and reply.usage.completion_tokens == 16


def test_sync_chat_stream_with_usage(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert text == "".join(f"tok{i} " for i in range(16))
    assert usage is not None and usage.completion_tokens == 16


async def test_async_chat_and_stream(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    reply = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    stream = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p for p in pieces if p) == "".join(f"tok{i} " for i in range(16))
    await client.close()


async def test_completions_streamed_and_not(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    reply = await client.completions.create(model="chat", prompt="say", max_tokens=3)
    assert reply.choices[0].text == "tok0 tok1 tok2 "
    stream = await client.completions.create(model="chat", prompt="say", stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == "".join(f"tok{i} " for i in range(16))
    await client.close()


def test_embeddings(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    reply = client.embeddings.create(model="embed", input=["one", "two"])
    assert len(reply.data) == 2
    assert len(reply.data[0].embedding) == 8
    assert reply.data[0].embedding != reply.data[1].embedding


def test_models_lists_configured_groups(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["chat", "embed"]


def test_unknown_model_is_404_model_not_found(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="sk-client", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"


def test_stream_is_relayed_incrementally(stack: Stack) -> None:
    sim = stack.sim("ok?tokens=6&delay=0.3")
    gateway = stack.gateway({"models": [group("slow", deployment("s", sim))]})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    arrivals = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 6
    # The first token reached the client long before the upstream sent its last one.
    assert arrivals[0] < 1.0
    assert arrivals[-1] - arrivals[0] > 1.0

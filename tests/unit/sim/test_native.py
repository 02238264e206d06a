"""The simulator's Gemini and Bedrock wires, proved by each provider's own SDK: `google-genai`
(AI Studio and Vertex URLs) and boto3's `bedrock-runtime` (`converse`, `converse_stream`)
parse what it sends, and its faults look to them as the real services' do."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import boto3  # type: ignore[import-untyped]
import pytest
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.eventstream import ChecksumMismatch  # type: ignore[import-untyped]
from botocore.exceptions import ClientError  # type: ignore[import-untyped]
from botocore.exceptions import EventStreamError as BotoEventStreamError
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2.credentials import Credentials as OAuthCredentials
from urllib3.exceptions import ProtocolError

from ballast.sim.answer import full_text
from ballast.sim.server import SimServer

pytestmark = pytest.mark.sim(name="cloud")

MODEL = "gemini-2.0-flash"
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


async def _rule(sim: SimServer, model: str, spec: str) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": model, "behaviour": spec}
        async with http.put(sim.url + "/sim/behaviour", json=body) as response:
            assert response.status == 200


def _gemini(sim: SimServer) -> genai.Client:
    options = types.HttpOptions(base_url=sim.url, timeout=5000)
    return genai.Client(api_key="gm-test-key-9876", http_options=options)


def _vertex(sim: SimServer, token: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=sim.url, headers={"authorization": f"Bearer {token}"})


VERTEX = "/v1/projects/p1/locations/us-central1/publishers/google/models/" + MODEL


# -- Gemini -------------------------------------------------------------------------------


async def test_genai_generate_content_reads_text_and_usage(sim: SimServer) -> None:
    client = _gemini(sim)
    answer = await client.aio.models.generate_content(
        model=MODEL,
        contents="hello there",
        config=types.GenerateContentConfig(system_instruction="be brief"),
    )
    assert answer.text == full_text(4)
    assert answer.candidates and answer.candidates[0].finish_reason == types.FinishReason.STOP
    assert answer.usage_metadata and answer.usage_metadata.candidates_token_count == 4


async def test_genai_stream_reads_every_piece(sim: SimServer) -> None:
    client = _gemini(sim)
    stream = await client.aio.models.generate_content_stream(model=MODEL, contents="hi")
    texts = [chunk.text async for chunk in stream]
    assert "".join(t or "" for t in texts) == full_text(4)
    assert len(texts) == 5  # one per token and the closing one


async def test_genai_reads_a_function_call(sim: SimServer) -> None:
    await _rule(sim, MODEL, "ok?tokens=3&shape=tool")
    client = _gemini(sim)
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(name="lookup", parameters={"type": "object"})
        ]
    )
    answer = await client.aio.models.generate_content(
        model=MODEL,
        contents="look it up",
        config=types.GenerateContentConfig(
            tools=[tool],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        ),
    )
    calls = answer.function_calls
    assert calls and calls[0].name == "lookup" and calls[0].args == {"q": full_text(3)}


async def test_genai_sees_a_429_as_resource_exhausted(sim: SimServer) -> None:
    await _rule(sim, MODEL, "429?retry_after=2")
    client = _gemini(sim)
    with pytest.raises(genai_errors.ClientError) as caught:
        await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"


async def test_genai_sees_a_blocked_prompt(sim: SimServer) -> None:
    await _rule(sim, MODEL, "content_filter")
    answer = await _gemini(sim).aio.models.generate_content(model=MODEL, contents="hi")
    assert answer.prompt_feedback and answer.prompt_feedback.block_reason == "SAFETY"


async def test_studio_without_a_key_is_refused(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"{sim.url}/v1beta/models/{MODEL}:generateContent"
        async with http.post(url, json={"contents": []}) as response:
            assert response.status == 403


async def test_vertex_needs_a_bearer_token_and_expires_one(sim: SimServer) -> None:
    await _rule(sim, MODEL, "expired_token")
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.url + VERTEX + ":generateContent", json=body) as response:
            assert response.status == 401  # no token at all
    async with _vertex(sim, "old-token") as http:
        async with http.post(VERTEX + ":generateContent", json=body) as response:
            assert response.status == 401
            assert (await response.json())["error"]["status"] == "UNAUTHENTICATED"
        async with http.post(VERTEX + ":generateContent", json=body) as response:
            assert response.status == 401  # an expired token stays expired
    async with _vertex(sim, "new-token") as http:
        url = VERTEX + ":streamGenerateContent?alt=sse"
        async with http.post(url, json=body) as response:
            assert response.status == 200
            assert b"tok3" in await response.read()


async def test_genai_reads_a_vertex_url_stream(sim: SimServer) -> None:
    """The Vertex form of the SDK builds the same path the simulator serves."""
    client = genai.Client(
        vertexai=True,
        project="p1",
        location="us-central1",
        credentials=OAuthCredentials(token="vx-token"),
        http_options=types.HttpOptions(base_url=sim.url, timeout=5000),
    )
    stream = await client.aio.models.generate_content_stream(model=MODEL, contents="hi")
    assert "".join([c.text or "" async for c in stream]) == full_text(4)


# -- Bedrock ------------------------------------------------------------------------------


@pytest.fixture
def bedrock_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSIMULATOR")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sim-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    yield


def _bedrock(sim: SimServer) -> Any:
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=5)
    return boto3.client("bedrock-runtime", endpoint_url=sim.url, config=config)


USER = [{"role": "user", "content": [{"text": "hello there"}]}]


async def test_boto3_converse_reads_text_and_usage(sim: SimServer, bedrock_env: None) -> None:
    client = _bedrock(sim)
    answer = await asyncio.to_thread(
        client.converse, modelId=BEDROCK_MODEL, messages=USER, system=[{"text": "be brief"}]
    )
    assert answer["output"]["message"]["content"] == [{"text": full_text(4)}]
    assert answer["stopReason"] == "end_turn"
    assert answer["usage"]["outputTokens"] == 4


def _stream_events(client: Any, **kwargs: Any) -> list[dict[str, Any]]:
    answer = client.converse_stream(modelId=BEDROCK_MODEL, messages=USER, **kwargs)
    return list(answer["stream"])


async def test_boto3_converse_stream_reads_every_event(sim: SimServer, bedrock_env: None) -> None:
    events = await asyncio.to_thread(_stream_events, _bedrock(sim))
    names = [next(iter(e)) for e in events]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    text = "".join(
        e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e
    )
    assert text == full_text(4)
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 4


async def test_boto3_reads_a_streamed_tool_use(sim: SimServer, bedrock_env: None) -> None:
    await _rule(sim, BEDROCK_MODEL, "ok?tokens=2&shape=tool")
    tools = {
        "tools": [{"toolSpec": {"name": "lookup", "inputSchema": {"json": {"type": "object"}}}}]
    }
    events = await asyncio.to_thread(_stream_events, _bedrock(sim), toolConfig=tools)
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "lookup"
    pieces = [
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "contentBlockDelta" in e
    ]
    assert "".join(pieces) == '{"q": "' + full_text(2) + '"}'
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"


async def test_boto3_sees_throttling(sim: SimServer, bedrock_env: None) -> None:
    await _rule(sim, BEDROCK_MODEL, "429")
    client = _bedrock(sim)
    with pytest.raises(ClientError) as caught:
        await asyncio.to_thread(client.converse, modelId=BEDROCK_MODEL, messages=USER)
    assert caught.value.response["Error"]["Code"] == "ThrottlingException"


async def test_boto3_sees_a_validation_error_for_context_length(
    sim: SimServer, bedrock_env: None
) -> None:
    await _rule(sim, BEDROCK_MODEL, "context_length")
    client = _bedrock(sim)
    with pytest.raises(ClientError) as caught:
        await asyncio.to_thread(client.converse, modelId=BEDROCK_MODEL, messages=USER)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "too long" in caught.value.response["Error"]["Message"]


async def test_boto3_refuses_a_frame_with_a_bad_crc(sim: SimServer, bedrock_env: None) -> None:
    await _rule(sim, BEDROCK_MODEL, "bad_crc?at=2")
    with pytest.raises(ChecksumMismatch):
        await asyncio.to_thread(_stream_events, _bedrock(sim))


async def test_boto3_sees_a_cut_stream_break(sim: SimServer, bedrock_env: None) -> None:
    await _rule(sim, BEDROCK_MODEL, "cut?after=2")
    seen: list[str] = []

    def read() -> None:
        answer = _bedrock(sim).converse_stream(modelId=BEDROCK_MODEL, messages=USER)
        seen.extend(next(iter(e)) for e in answer["stream"])

    with pytest.raises(ProtocolError):
        await asyncio.to_thread(read)
    assert seen == ["messageStart", "contentBlockDelta", "contentBlockDelta"]


async def test_an_unsigned_request_is_refused(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"{sim.url}/model/{BEDROCK_MODEL}/converse"
        async with http.post(url, json={"messages": USER}) as response:
            assert response.status == 403
            assert response.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"


async def test_boto3_raises_a_mid_stream_exception(sim: SimServer, bedrock_env: None) -> None:
    await _rule(sim, BEDROCK_MODEL, "error_event?after=2")
    seen: list[str] = []

    def read() -> None:
        answer = _bedrock(sim).converse_stream(modelId=BEDROCK_MODEL, messages=USER)
        seen.extend(next(iter(e)) for e in answer["stream"])

    with pytest.raises(BotoEventStreamError) as caught:
        await asyncio.to_thread(read)
    assert caught.value.response["Error"]["Code"] == "serviceUnavailableException"
    assert seen == ["messageStart", "contentBlockDelta", "contentBlockDelta"]


async def test_genai_raises_a_mid_stream_error(sim: SimServer) -> None:
    await _rule(sim, MODEL, "error_event?after=2")
    stream = await _gemini(sim).aio.models.generate_content_stream(model=MODEL, contents="hi")
    texts: list[str] = []
    with pytest.raises(genai_errors.APIError) as caught:
        async for chunk in stream:
            texts.append(chunk.text or "")
    assert caught.value.status == "UNAVAILABLE"
    assert "".join(texts) == full_text(2)

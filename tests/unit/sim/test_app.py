"""The simulator over real loopback HTTP, driven by aiohttp and by the official openai SDK."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from ballast.sim.answer import full_text
from ballast.sim.server import SimServer, start_sim

pytestmark = pytest.mark.sim(name="alpha")

CHAT = "/v1/chat/completions"
USER: list[Any] = [{"role": "user", "content": "hello"}]
SRC = str(Path(__file__).resolve().parents[3] / "src")


@pytest.fixture
async def client(sim: SimServer) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="sk-test-key-1234", max_retries=0)
    try:
        yield sdk
    finally:
        await sdk.close()


def chat_body(stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi there"}]}
    if stream:
        body["stream"] = True
    body.update(extra)
    return body


def parse_events(raw: bytes) -> list[Any]:
    """Data events of an SSE body: parsed JSON, the string "[DONE]" or the raw bad line."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block.startswith("data: "):
            continue
        data = block[len("data: ") :]
        if data == "[DONE]":
            events.append("[DONE]")
            continue
        try:
            events.append(json.loads(data))
        except json.JSONDecodeError:
            events.append(("bad", block))
    return events


async def post_stream(
    http: aiohttp.ClientSession, sim: SimServer, spec: str, **extra: Any
) -> tuple[aiohttp.ClientResponse, bytes]:
    async with http.post(
        sim.url + CHAT, json=chat_body(True, **extra), headers={"x-sim-behaviour": spec}
    ) as resp:
        return resp, await resp.read()


async def attempts(http: aiohttp.ClientSession, sim: SimServer) -> list[dict[str, Any]]:
    async with http.get(sim.url + "/sim/log") as resp:
        result: list[dict[str, Any]] = (await resp.json())["attempts"]
        return result


def text_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e["choices"]
    )


# -- basics --------------------------------------------------------------------------------


async def test_start_sim_binds_a_real_port_and_reports_health(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    assert sim.port > 0
    assert sim.url == f"http://127.0.0.1:{sim.port}"
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "ok"
        assert resp.headers["x-sim-name"] == "alpha"


async def test_sdk_non_stream_chat(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model="gpt-sim", messages=[{"role": "user", "content": "one two three"}]
    )
    assert result.id.startswith("chatcmpl-sim-")
    assert result.model == "gpt-sim"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 4)
    assert result.usage.total_tokens == 7


async def test_sdk_stream_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-sim-behaviour": "ok?tokens=3"},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert contents == ["tok0 ", "tok1 ", "tok2 ", None]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_a_repeated_long_prompt_reports_cached_tokens(client: openai.AsyncOpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "rule " * 1100},
        {"role": "user", "content": "hi"},
    ]
    cached = []
    for key in ("one", "one", "two"):
        reply = await client.chat.completions.create(
            model="m", messages=messages, prompt_cache_key=key
        )
        assert reply.usage is not None
        details = reply.usage.prompt_tokens_details
        cached.append(details.cached_tokens if details is not None else 0)
    assert cached == [0, 1024, 0]  # written, read; another key, another cache
    stream = await client.chat.completions.create(
        model="m",
        messages=messages,
        prompt_cache_key="two",
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage async for chunk in stream][-1]
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1024
    for expected in (0, 1024):
        response = await client.responses.create(model="m", instructions="rule " * 1100, input="hi")
        assert response.usage is not None
        assert response.usage.input_tokens_details.cached_tokens == expected


async def test_raw_stream_format(sim: SimServer, http: aiohttp.ClientSession) -> None:
    resp, raw = await post_stream(http, sim, "ok?tokens=2")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = parse_events(raw)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0] == {
        "index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"
    }  # fmt: skip
    assert events[-1] == "[DONE]"
    assert text_of(events) == "tok0 tok1 "
    assert all("usage" not in e for e in events if isinstance(e, dict))


async def test_stream_chunks_arrive_incrementally(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    arrivals: list[float] = []
    start = time.monotonic()
    async with http.post(
        sim.url + CHAT, json=chat_body(True), headers={"x-sim-behaviour": "ok?tokens=3&delay=0.1"}
    ) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 6  # role, 3 tokens, finish, [DONE]
    assert arrivals[-1] - arrivals[0] >= 0.4
    assert arrivals[1] < arrivals[-1] - 0.2  # not buffered until the end


async def test_completions_endpoint(client: openai.AsyncOpenAI) -> None:
    result = await client.completions.create(model="m", prompt="a b c", max_tokens=2)
    assert result.choices[0].text == "tok0 tok1 "
    assert result.choices[0].finish_reason == "length"
    assert result.id.startswith("cmpl-sim-")
    stream = await client.completions.create(model="m", prompt="a", stream=True)
    texts = [chunk.choices[0].text async for chunk in stream]
    assert "".join(texts) == full_text(4)


async def test_embeddings_and_models(client: openai.AsyncOpenAI) -> None:
    result = await client.embeddings.create(model="emb", input=["a b", "c"])
    assert [len(d.embedding) for d in result.data] == [8, 8]
    assert result.data[0].embedding != result.data[1].embedding
    again = await client.embeddings.create(model="emb", input="a b", encoding_format="base64")
    assert isinstance(again.data[0].embedding, str)
    decoded = struct.unpack("<8f", base64.b64decode(again.data[0].embedding))
    assert list(decoded) == pytest.approx(result.data[0].embedding, abs=1e-5)
    assert result.usage.prompt_tokens == 3
    models = await client.models.list()
    ids = [m.id for m in models.data]
    assert "sim-model" in ids and "emb" in ids


async def test_max_tokens_gives_length(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert result.choices[0].message.content == "tok0 tok1 "
    assert result.choices[0].finish_reason == "length"


async def test_bad_requests_get_openai_errors(sim: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.post(sim.url + CHAT, data=b"{nope") as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
    async with http.post(sim.url + CHAT, json={"messages": []}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "model"
    async with http.post(
        sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "ok?tokens=lots"}
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["code"] == "invalid_behaviour" and "tokens" in error["message"]


# -- error behaviours ----------------------------------------------------------------------


async def test_429_with_and_without_retry_after(
    sim: SimServer, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    async with http.post(
        sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "429?retry_after=2"}
    ) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "2"
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
    async with http.post(sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "429"}) as r:
        assert r.status == 429
        assert "Retry-After" not in r.headers
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-sim-behaviour": "429"}
        )


async def test_500_once_per_model(sim: SimServer, http: aiohttp.ClientSession) -> None:
    headers = {"x-sim-behaviour": "500?mode=once"}
    statuses = []
    for model in ("a", "a", "b", "a"):
        async with http.post(sim.url + CHAT, json=chat_body(model=model), headers=headers) as r:
            statuses.append(r.status)
    assert statuses == [500, 200, 500, 200]
    outcomes = [a["outcome"] for a in await attempts(http, sim)]
    assert outcomes == ["500", "ok", "500", "ok"]


async def test_503_flap_recovers_after_its_window(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    async with http.put(
        sim.url + "/sim/behaviour", json={"model": "m", "behaviour": "503?mode=flap&seconds=0.3"}
    ) as resp:
        assert resp.status == 200
    async with http.post(sim.url + CHAT, json=chat_body()) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["type"] == "server_error"
    await asyncio.sleep(0.35)
    async with http.post(sim.url + CHAT, json=chat_body()) as resp:
        assert resp.status == 200


async def test_random_with_seed_is_reproducible(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    async def run() -> list[int]:
        async with http.put(
            sim.url + "/sim/behaviour",
            json={"model": "*", "behaviour": "500?mode=random&p=0.5&seed=3"},
        ) as r:
            assert r.status == 200  # the rule was taken
        statuses = []
        for _ in range(16):
            async with http.post(sim.url + CHAT, json=chat_body()) as resp:
                statuses.append(resp.status)
        return statuses

    first, second = await run(), await run()
    assert first == second
    assert set(first) == {200, 500}


async def test_client_errors(client: openai.AsyncOpenAI) -> None:
    async def fail(spec: str) -> openai.APIStatusError:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"x-sim-behaviour": spec},
            )
        return info.value

    error = await fail("context_length")
    assert (error.status_code, error.code) == (400, "context_length_exceeded")
    assert error.type == "invalid_request_error"
    error = await fail("content_filter")
    assert (error.status_code, error.code) == (400, "content_filter")
    assert "(sim: hate)" in error.message
    error = await fail("409?code=sampling_run_inactive")
    assert (error.status_code, error.code) == (409, "sampling_run_inactive")
    error = await fail("409")
    assert error.code == "conflict"
    error = await fail("401")
    assert isinstance(error, openai.AuthenticationError)
    assert error.code == "invalid_api_key" and "1234" in error.message


# -- transport faults ----------------------------------------------------------------------


async def test_reset_before_headers(
    sim: SimServer, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.post(
            sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "reset"}
        ):
            pytest.fail("response headers arrived")
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-sim-behaviour": "reset"}
        )
    assert [a["outcome"] for a in await attempts(http, sim)] == ["reset", "reset"]


async def test_hang_times_out_and_notices_the_client_leaving(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            sim.url + CHAT,
            json=chat_body(),
            headers={"x-sim-behaviour": "hang"},
            timeout=aiohttp.ClientTimeout(total=0.3),
        ):
            pytest.fail("response headers arrived")
    assert time.monotonic() - started < 2
    for _ in range(50):
        log = await attempts(http, sim)
        if log[0]["disconnected"]:
            break
        await asyncio.sleep(0.02)
    assert log[0]["outcome"] == "hang" and log[0]["disconnected"]


async def test_slow_first_delays_headers(sim: SimServer, http: aiohttp.ClientSession) -> None:
    started = time.monotonic()
    async with http.post(
        sim.url + CHAT, json=chat_body(True), headers={"x-sim-behaviour": "slow_first?delay=0.3"}
    ) as resp:
        headers_after = time.monotonic() - started
        events = parse_events(await resp.read())
    assert headers_after >= 0.25
    assert events[-1] == "[DONE]" and text_of(events) == full_text(16)


async def test_cut_stops_without_done(sim: SimServer, http: aiohttp.ClientSession) -> None:
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            sim.url + CHAT, json=chat_body(True), headers={"x-sim-behaviour": "cut?after=2"}
        ) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_any():
                received += chunk
    events = parse_events(received)
    assert text_of(events) == "tok0 tok1 "
    assert "[DONE]" not in events
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    log = await attempts(http, sim)
    assert (log[0]["outcome"], log[0]["tokens"]) == ("cut", 2)


async def test_cut_non_stream_truncates_the_body(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "cut"}
        ) as resp:
            await resp.read()


async def test_stall_pauses_then_completes(sim: SimServer, http: aiohttp.ClientSession) -> None:
    arrivals: list[tuple[float, bytes]] = []
    start = time.monotonic()
    async with http.post(
        sim.url + CHAT,
        json=chat_body(True),
        headers={"x-sim-behaviour": "stall?after=1&seconds=0.3&tokens=3"},
    ) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                arrivals.append((time.monotonic() - start, line))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) >= 0.25
    assert gaps.index(max(gaps)) == 1  # after role chunk and tok0, before tok1
    assert arrivals[-1][1].strip() == b"data: [DONE]"


async def test_malformed_chunk_replaced(sim: SimServer, http: aiohttp.ClientSession) -> None:
    _, raw = await post_stream(http, sim, "malformed?at=2&tokens=4")
    events = parse_events(raw)
    assert events[2] == ("bad", "data: {not json")
    assert events[-1] == "[DONE]"
    assert text_of(events) == "tok0 tok2 tok3 "


async def test_malformed_non_stream_is_not_json(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        sim.url + CHAT, json=chat_body(), headers={"x-sim-behaviour": "malformed"}
    ) as r:
        assert r.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(await r.read())


async def test_no_done_completes_without_done(sim: SimServer, http: aiohttp.ClientSession) -> None:
    resp, raw = await post_stream(
        http, sim, "no_done?tokens=4", stream_options={"include_usage": True}
    )
    events = parse_events(raw)
    assert "[DONE]" not in events
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == 4
    assert resp.headers.get("Connection", "").lower() == "close"


async def test_client_disconnect_is_quiet(
    sim: SimServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with http.post(
        sim.url + CHAT,
        json=chat_body(True),
        headers={"x-sim-behaviour": "ok?tokens=200&delay=0.01"},
    ) as resp:
        await resp.content.readline()
        resp.close()
    for _ in range(100):
        log = await attempts(http, sim)
        if log[0]["disconnected"]:
            break
        await asyncio.sleep(0.02)
    assert log[0]["disconnected"] and log[0]["tokens"] < 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_close_ends_hanging_and_stalled_requests(http: aiohttp.ClientSession) -> None:
    server = await start_sim(default="hang")
    hanging = asyncio.create_task(http.post(server.url + CHAT, json=chat_body()))
    stalled = await http.post(
        server.url + CHAT, json=chat_body(True), headers={"x-sim-behaviour": "stall?after=1"}
    )
    await stalled.content.readline()
    started = time.monotonic()
    await server.close()
    assert time.monotonic() - started < 0.4
    with pytest.raises(aiohttp.ClientConnectionError):
        await hanging
    with pytest.raises(aiohttp.ClientPayloadError):
        await stalled.read()


# -- prefill continuation ------------------------------------------------------------------


async def test_prefill_continues_a_cut_stream(
    sim: SimServer, http: aiohttp.ClientSession, client: openai.AsyncOpenAI
) -> None:
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            sim.url + CHAT,
            json=chat_body(True),
            headers={"x-sim-behaviour": "cut?after=3&tokens=6"},
        ) as resp:
            async for chunk in resp.content.iter_any():
                received += chunk
    partial = text_of(parse_events(received))
    assert partial == "tok0 tok1 tok2 "
    result = await client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": partial},
        ],
        extra_headers={"x-sim-behaviour": "ok?tokens=6"},
    )
    rest = result.choices[0].message.content
    assert rest == "tok3 tok4 tok5 "
    assert partial + rest == full_text(6)
    assert result.usage is not None and result.usage.completion_tokens == 3
    log = await attempts(http, sim)
    assert [a["prefill"] for a in log] == [False, True]


async def test_prefill_stream_and_non_prefix(sim: SimServer, http: aiohttp.ClientSession) -> None:
    prefilled = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "tok0 tok"}]
    _, raw = await post_stream(http, sim, "ok?tokens=3", messages=prefilled)
    assert text_of(parse_events(raw)) == "1 tok2 "
    other = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure: "}]
    _, raw = await post_stream(http, sim, "ok?tokens=3", messages=other)
    assert text_of(parse_events(raw)) == full_text(3)


# -- admin ---------------------------------------------------------------------------------


async def test_admin_rules_per_model(sim: SimServer, http: aiohttp.ClientSession) -> None:
    async def status(model: str, headers: dict[str, str] | None = None) -> int:
        async with http.post(sim.url + CHAT, json=chat_body(model=model), headers=headers) as r:
            return r.status

    async with http.put(sim.url + "/sim/behaviour", json={"model": "a", "behaviour": "503"}) as r:
        assert (await r.json())["behaviour"] == "503"
    assert (await status("a"), await status("b")) == (503, 200)
    assert await status("a", {"x-sim-behaviour": "ok"}) == 200  # header wins
    async with http.put(sim.url + "/sim/behaviour", json={"model": "*", "behaviour": "429"}) as r:
        assert r.status == 200  # the rule was taken
    assert (await status("a"), await status("b")) == (503, 429)
    async with http.get(sim.url + "/sim/behaviour") as r:
        listed = await r.json()
    assert listed == {"default": "ok?tokens=4", "rules": {"a": "503", "*": "429"}}
    async with http.put(sim.url + "/sim/behaviour", json={"model": "a", "behaviour": "bad"}) as r:
        assert r.status == 400
        assert "unknown behaviour" in (await r.json())["error"]["message"]
    async with http.delete(sim.url + "/sim/behaviour") as r:
        assert (await r.json())["cleared"] == 2
    assert (await status("a"), await status("b")) == (200, 200)


async def test_setting_a_rule_resets_once_state(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    async def status() -> int:
        async with http.post(sim.url + CHAT, json=chat_body()) as r:
            return r.status

    rule = {"model": "m", "behaviour": "500?mode=once"}
    async with http.put(sim.url + "/sim/behaviour", json=rule) as r:
        assert r.status == 200  # the rule was taken
    assert [await status(), await status()] == [500, 200]
    async with http.put(sim.url + "/sim/behaviour", json=rule) as r:
        assert r.status == 200  # the rule was taken
    assert await status() == 500


async def test_attempt_log_and_stats(sim: SimServer, http: aiohttp.ClientSession) -> None:
    headers = {"authorization": "Bearer sk-upstream-abcd9876", "x-request-id": "req-1"}
    async with http.post(sim.url + CHAT, json=chat_body(model="a"), headers=headers) as r:
        assert r.status == 200
    headers["x-sim-behaviour"] = "500"
    async with http.post(sim.url + CHAT, json=chat_body(True, model="b"), headers=headers) as r:
        assert r.status == 500
    log = await attempts(http, sim)
    assert len(log) == 2
    first = log[0]
    assert first["model"] == "a" and first["path"] == CHAT
    assert first["behaviour"] == "ok?tokens=4" and first["outcome"] == "ok"
    assert first["stream"] is False and first["prefill"] is False
    assert first["headers"] == {"authorization": "***9876", "x-request-id": "req-1"}
    assert abs(first["time"] - time.time()) < 60
    assert (log[1]["outcome"], log[1]["stream"]) == ("500", True)
    async with http.get(sim.url + "/sim/stats") as r:
        stats = await r.json()
    assert stats["by_outcome"] == {"ok": 1, "500": 1}
    assert stats["by_model"] == {"a": 1, "b": 1}
    async with http.delete(sim.url + "/sim/log") as r:
        assert (await r.json())["cleared"] == 2
    assert await attempts(http, sim) == []


# -- run_sim -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_run_sim_serves_until_sigterm(http: aiohttp.ClientSession) -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": SRC}
    code = f"from ballast.sim.server import run_sim; run_sim('127.0.0.1', {port}, 'ok', 'cli')"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        for _ in range(200):
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                    assert resp.headers["x-sim-name"] == "cli"
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.025)
        else:
            pytest.fail("run_sim did not start")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

"""The response cache through the whole gateway, on a real Redis: hits are byte-identical and
fast, streams replay as streams, a blackholed Redis turns every lookup into a quick miss, keys
never see each other's entries, and a stampede makes one upstream call."""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
import redis

from tests.faultproxy import FaultProxy
from tests.stack import Gateway, Stack, deployment, group

pytestmark = pytest.mark.integration

MASTER = "sk-master-for-cache-tests-0123456789"


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own (the Redis is shared: never flush it)."""
    name = f"test-cache-{uuid.uuid4().hex[:12]}:"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=name + "*"):
        client.delete(key)


def config(
    sims: list[Any],
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    cache: dict[str, Any] | None = None,
    master: bool = False,
    **state: Any,
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "state": {
            "redis_url": redis_url,
            "cache_prefix": prefix,
            "database_url": f"sqlite:///{tmp_path / 'ballast.db'}",
            "spend_journal": str(tmp_path / "spend.journal"),
            "spend_flush_interval": 0.1,
            "redis_timeout": 0.1,
            **state,
        },
        "routing": {"max_attempts": 2},
        "prices": {"sim-chat": {"input": 1_000_000, "output": 1_000_000}},  # $1 a token
        "models": [
            group(
                "chat",
                *(deployment(f"d{i}", sim, model="sim-chat") for i, sim in enumerate(sims)),
                strategy="ordered",
                cache=cache if cache is not None else {"ttl": 60},
            ),
            group("plain", deployment("p", sims[-1], model="sim-chat")),
        ],
    }
    if master:
        settings["server"] = {"master_key": MASTER}
    return settings


def post(
    gw: Gateway,
    body: dict[str, Any],
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes, float]:
    request = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "content-type": "application/json",
            **({"authorization": f"Bearer {key}"} if key else {}),
            **(headers or {}),
        },
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            data = response.read()
            took = time.perf_counter() - started
            return response.status, dict(response.headers), data, took
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read(), time.perf_counter() - started


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": content}], **extra}


def admin(gw: Gateway, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        gw.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def cache_keys(redis_url: str, prefix: str) -> list[bytes]:
    return list(redis.Redis.from_url(redis_url).scan_iter(match=prefix + "*"))


def test_second_identical_request_is_a_byte_identical_fast_hit(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim("ok?latency=0.3")
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix))
    body = chat(f"hello {uuid.uuid4()}", temperature=0)
    status, headers, first, miss_time = post(gw, body)
    assert status == 200 and headers["x-ballast-cache"] == "miss"
    assert miss_time >= 0.3
    hits = [post(gw, body) for _ in range(10)]
    assert all(s == 200 and h["x-ballast-cache"] == "hit" and b == first for s, h, b, _ in hits)
    hit_time = statistics.median(t for _, _, _, t in hits)
    assert hit_time < 0.1, f"hit took {hit_time * 1000:.1f} ms, miss {miss_time * 1000:.1f} ms"
    assert len(stack.attempts(sim)) == 1
    # Different parameters are a different answer; delivery fields are not.
    assert post(gw, {**body, "temperature": 0.5})[1]["x-ballast-cache"] == "miss"
    assert post(gw, {**body, "user": "someone-else"})[1]["x-ballast-cache"] == "hit"
    # Stored compressed, with the group's TTL.
    keys = cache_keys(redis_url, prefix)
    assert len(keys) == 2
    client = redis.Redis.from_url(redis_url)
    stored = [client.get(k) for k in keys]
    assert first in [zlib.decompress(v) for v in stored if v is not None]  # type: ignore[arg-type]
    assert all(0 < client.pttl(k) <= 60_000 for k in keys)
    # A group without a cache section is untouched: no lookups, no header.
    plain = post(gw, {**body, "model": "plain"})
    assert plain[0] == 200 and "x-ballast-cache" not in plain[1]


def test_streaming_hit_replays_a_stream_the_sdk_accepts(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim("ok?delay=0.02")
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": f"stream {uuid.uuid4()}"}]
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=messages, stream=True
    )
    assert raw.headers["x-ballast-cache"] == "miss"
    original = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in original if c.choices)
    assert text == "".join(f"tok{i} " for i in range(16))
    assert all(c.usage is None for c in original)

    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    replayed = list(raw.parse())
    took = time.perf_counter() - started
    assert raw.headers["x-ballast-cache"] == "hit"
    assert took < 0.2  # the upstream took 16 x 20 ms
    assert replayed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in replayed if c.choices) == text
    finishes = [c.choices[0].finish_reason for c in replayed if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert replayed[-1].choices == [] and replayed[-1].usage is not None
    assert replayed[-1].usage.completion_tokens == 16
    # The same entry answers a non-streamed request.
    reply = client.chat.completions.with_raw_response.create(model="chat", messages=messages)
    assert reply.headers["x-ballast-cache"] == "hit"
    assert reply.parse().choices[0].message.content == text
    assert len(stack.attempts(sim)) == 1


def test_an_answer_healed_by_continuation_is_stored_whole(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    broken, healthy = stack.sim("cut?after=3", name="broken"), stack.sim("ok", name="healthy")
    gw = stack.gateway(config([broken, healthy], tmp_path, redis_url, prefix))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": f"heal {uuid.uuid4()}"}]
    streamed = client.chat.completions.create(model="chat", messages=messages, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    full = "".join(f"tok{i} " for i in range(16))
    assert text == full
    assert len(stack.attempts(healthy)) == 1  # it was continued there
    reply = client.chat.completions.with_raw_response.create(model="chat", messages=messages)
    assert reply.headers["x-ballast-cache"] == "hit"
    assert reply.parse().choices[0].message.content == full


def test_refresh_bypasses_and_rewrites_and_off_leaves_the_cache_alone(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix))
    body = chat(f"refresh {uuid.uuid4()}")
    first = post(gw, body)[2]
    assert post(gw, body)[2] == first
    status, headers, fresh, _ = post(gw, body, headers={"x-ballast-cache": "refresh"})
    assert status == 200 and headers["x-ballast-cache"] == "bypass" and fresh != first
    assert len(stack.attempts(sim)) == 2
    status, headers, again, _ = post(gw, body)
    assert headers["x-ballast-cache"] == "hit" and again == fresh  # rewritten
    for field in (False, {"no-cache": True, "no-store": True}, "off"):
        status, headers, _, _ = post(gw, {**body, "cache": field})
        assert status == 200 and headers["x-ballast-cache"] == "bypass"
    assert len(stack.attempts(sim)) == 5
    assert post(gw, body)[2] == fresh  # `off` stored nothing
    status, headers, refreshed, _ = post(gw, {**body, "cache": {"no-cache": True}})
    assert headers["x-ballast-cache"] == "bypass" and post(gw, body)[2] == refreshed
    assert post(gw, body, headers={"x-ballast-cache": "maybe"})[0] == 400


def test_entries_over_the_size_cap_are_not_stored(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    gw = stack.gateway(
        config([sim], tmp_path, redis_url, prefix, cache={"ttl": 60, "max_entry_bytes": 700})
    )
    small = chat(f"small {uuid.uuid4()}", max_tokens=4)
    huge = chat(f"huge {uuid.uuid4()}", max_tokens=200)
    stack.set_behaviour(sim, "ok?tokens=200")
    assert post(gw, small)[1]["x-ballast-cache"] == "miss"
    assert post(gw, huge)[1]["x-ballast-cache"] == "miss"
    assert post(gw, huge)[1]["x-ballast-cache"] == "miss"  # over the cap: never kept
    assert post(gw, small)[1]["x-ballast-cache"] == "hit"
    assert len(cache_keys(redis_url, prefix)) == 1


def test_blackholed_redis_makes_every_lookup_a_quick_miss_and_hits_resume(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    parsed = urlparse(redis_url)
    proxy = FaultProxy(parsed.hostname or "127.0.0.1", parsed.port or 6379)
    port = stack.thread.run(proxy.start())
    sim = stack.sim()
    gw = stack.gateway(
        config(
            [sim],
            tmp_path,
            f"redis://127.0.0.1:{port}{parsed.path}",
            prefix,
            redis_breaker={"failure_threshold": 3, "recovery_timeout": 3.0, "probe_timeout": 0.5},
        )
    )
    cached = chat(f"cached {uuid.uuid4()}")
    post(gw, cached)
    assert post(gw, cached)[1]["x-ballast-cache"] == "hit"
    baseline = [post(gw, chat(f"cold {i} {uuid.uuid4()}"))[3] for i in range(60)]
    base_p99 = statistics.quantiles(baseline, n=100)[98]

    stack.thread.loop.call_soon_threadsafe(proxy.blackhole)
    during = [post(gw, cached) for _ in range(120)]
    assert {s for s, _, _, _ in during} == {200}  # zero errors
    assert {h["x-ballast-cache"] for _, h, _, _ in during} == {"miss"}
    store = gw.app.state.store
    assert store is not None
    assert store.breaker.state.value == "open"
    opened_by = proxy.accepted
    after_open = [t for _, _, _, t in during[5:]]
    p99 = statistics.quantiles(after_open, n=100)[98]
    assert p99 - base_p99 < 0.050, f"p99 added {1000 * (p99 - base_p99):.1f} ms"
    assert all(post(gw, cached)[0] == 200 for _ in range(10))
    assert proxy.accepted == opened_by  # an open breaker makes no network calls

    stack.thread.loop.call_soon_threadsafe(proxy.passthrough)
    deadline = time.monotonic() + 10
    status = ""
    while time.monotonic() < deadline:
        status = post(gw, cached)[1]["x-ballast-cache"]
        if status == "hit":
            break
        time.sleep(0.1)
    assert status == "hit", store.breaker.snapshot()
    stack.thread.run(proxy.close())


def test_keys_never_see_each_others_entries_and_never_appear_in_cache_keys(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix, master=True))
    made = [admin(gw, "POST", "/admin/keys", {"name": f"k{n}"}) for n in range(2)]
    (key1, id1), (key2, id2) = [(k["key"], k["id"]) for k in made]
    body = chat(f"private {uuid.uuid4()}")
    assert post(gw, body, key1)[1]["x-ballast-cache"] == "miss"
    assert post(gw, body, key1)[1]["x-ballast-cache"] == "hit"
    assert post(gw, body, key2)[1]["x-ballast-cache"] == "miss"
    assert post(gw, body, key2)[1]["x-ballast-cache"] == "hit"
    assert post(gw, body, MASTER)[1]["x-ballast-cache"] == "miss"
    assert len(stack.attempts(sim)) == 3
    keys = cache_keys(redis_url, prefix)
    assert len(keys) == 3
    client = redis.Redis.from_url(redis_url)
    for secret in (key1, id1, key2, id2, MASTER):
        assert all(secret.encode() not in k for k in keys)
        for k in keys:
            value = client.get(k)
            assert value is not None and secret.encode() not in zlib.decompress(value)  # type: ignore[arg-type]
    # An unauthenticated request never reaches the cache.
    assert post(gw, body)[0] == 401


def test_global_scope_shares_entries_between_keys(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    cache = {"ttl": 60, "scope": "global"}
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix, cache=cache, master=True))
    key1, key2 = (admin(gw, "POST", "/admin/keys", {"name": f"g{n}"})["key"] for n in range(2))
    body = chat(f"shared {uuid.uuid4()}")
    assert post(gw, body, key1)[1]["x-ballast-cache"] == "miss"
    assert post(gw, body, key2)[1]["x-ballast-cache"] == "hit"


def test_a_hit_counts_as_a_request_but_not_against_tpm_and_costs_nothing(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix, master=True))
    # Each request books ~270 tokens up front; the answer uses 17. With tpm=300 a third
    # request that used tokens would be refused, so only hits that use none all get through.
    made = admin(gw, "POST", "/admin/keys", {"name": "limits", "rpm": 6, "tpm": 300})
    key, key_id = made["key"], made["id"]
    body = chat("hi")
    statuses = []
    for _ in range(6):
        status, headers, _, _ = post(gw, body, key)
        statuses.append((status, headers.get("x-ballast-cache")))
        time.sleep(0.05)  # the lease is reconciled just after the answer
    assert statuses == [(200, "miss")] + [(200, "hit")] * 5
    status, _, error, _ = post(gw, body, key)
    assert status == 429 and b"requests" in error  # hits still count as requests
    assert len(stack.attempts(sim)) == 1
    spend: dict[str, Any] = {}
    for _ in range(50):
        spend = admin(gw, "GET", f"/admin/keys/spend?id={key_id}")
        if spend["spend"] > 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # every hit's event has been flushed by now
    spend = admin(gw, "GET", f"/admin/keys/spend?id={key_id}")
    assert spend["spend"] == pytest.approx(17.0)  # the miss only: 1 prompt word + 16 tokens


@pytest.mark.parametrize("stream", [False, True])
def test_twenty_concurrent_identical_requests_make_one_upstream_call(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path, stream: bool
) -> None:
    sim = stack.sim("ok?latency=0.3&delay=0.02")
    cache = {"ttl": 60, "coalesce": True, "coalesce_wait": 10}
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix, cache=cache))
    body = chat(f"stampede {uuid.uuid4()}", stream=stream)
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: post(gw, body), range(20)))
    assert {s for s, _, _, _ in results} == {200}
    assert len(stack.attempts(sim)) == 1
    statuses = sorted(h["x-ballast-cache"] for _, h, _, _ in results)
    assert statuses == ["hit"] * 19 + ["miss"]
    texts = set()
    for _, _, data, _ in results:
        if stream:
            assert data.endswith(b"data: [DONE]\n\n")
            events = [json.loads(line[6:]) for line in data.split(b"\n\n") if line[6:7] == b"{"]
            texts.add("".join(e["choices"][0]["delta"].get("content") or "" for e in events))
        else:
            texts.add(json.loads(data)["choices"][0]["message"]["content"])
    assert texts == {"".join(f"tok{i} " for i in range(16))}


def test_completions_and_embeddings_are_cached_too(
    stack: Stack, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    sim = stack.sim()
    gw = stack.gateway(config([sim], tmp_path, redis_url, prefix))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    text = f"embed {uuid.uuid4()}"
    first = client.embeddings.with_raw_response.create(model="chat", input=[text, "two"])
    again = client.embeddings.with_raw_response.create(model="chat", input=[text, "two"])
    assert (first.headers["x-ballast-cache"], again.headers["x-ballast-cache"]) == ("miss", "hit")
    assert first.content == again.content
    other = client.embeddings.with_raw_response.create(model="chat", input=[text])
    assert other.headers["x-ballast-cache"] == "miss"
    prompt = f"complete {uuid.uuid4()}"
    plain = client.completions.with_raw_response.create(model="chat", prompt=prompt)
    assert plain.headers["x-ballast-cache"] == "miss"
    streamed = client.completions.with_raw_response.create(model="chat", prompt=prompt, stream=True)
    assert streamed.headers["x-ballast-cache"] == "hit"
    assert "".join(c.choices[0].text for c in streamed.parse() if c.choices) == (
        plain.parse().choices[0].text
    )
    assert len(stack.attempts(sim)) == 3

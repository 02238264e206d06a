"""The response cache's parts: the key, the LRU, replay and assembly, single-flight, control."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.cache.flight import SingleFlight
from ballast.cache.keys import cache_key, normalise
from ballast.cache.replay import assemble, is_complete, pieces, replay, split_events
from ballast.cache.service import BYPASS, DEFAULT, HIT, MISS, NO_STORE, OFF, REFRESH, ResponseCache
from ballast.cache.store import LocalCacheStore
from ballast.config import CacheSettings, Deployment, Timeouts, UpstreamSettings
from ballast.pipeline.caching import mode_of, scope_of, take_field
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.providers import AdapterContext
from ballast.providers.openai import OpenAIAdapter
from ballast.resilience.clock import ManualClock
from ballast.upstream.client import Upstream

CHAT = "/chat/completions"
BASE: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 20,
}


def key(payload: dict[str, Any], scope: str = "k1", path: str = CHAT, group: str = "chat") -> str:
    return cache_key(path, group, payload, scope)


# -- keys ----------------------------------------------------------------------------------


def test_delivery_and_identity_fields_do_not_change_the_key() -> None:
    same = {
        **BASE,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "someone",
        "metadata": {"trace": "x"},
        "cache": {"no-store": True},
        "store": False,
        "seed": None,  # null is the same as absent
    }
    assert key(same) == key(BASE)
    reordered = dict(reversed(list(BASE.items())))
    reordered["messages"] = [{"content": "hi", "role": "user"}]
    assert key(reordered) == key(BASE)
    assert key({**BASE, "temperature": 0.0}) == key(BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"temperature": 0.5},
        {"max_tokens": 21},
        {"model": "chat-2"},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
        {"n": 2},
        {"seed": 7},
    ],
)
def test_everything_that_changes_the_answer_changes_the_key(change: dict[str, Any]) -> None:
    assert key({**BASE, **change}) != key(BASE)


def test_scope_path_and_group_are_part_of_the_key_and_nothing_is_in_clear() -> None:
    assert key(BASE, scope="k1") != key(BASE, scope="k2")
    assert key(BASE, path="/completions") != key(BASE)
    assert key(BASE, group="other") != key(BASE)
    digest = key(BASE, scope="key-id-123")
    assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    assert "key-id-123" not in digest
    assert "stream" not in normalise({**BASE, "stream": True})


# -- the in-process LRU ----------------------------------------------------------------------


async def test_lru_evicts_least_recently_used_and_expires_entries() -> None:
    clock = ManualClock()
    store = LocalCacheStore(max_bytes=30, max_entries=3, clock=clock)
    for name in "abc":
        assert await store.put(name, name.encode() * 10, ttl=60, max_bytes=100)
    assert await store.get("a") == b"a" * 10  # a is now the most recent
    assert await store.put("d", b"d" * 10, ttl=60, max_bytes=100)
    assert await store.get("b") is None  # the least recently used went
    assert await store.get("a") is not None and await store.get("d") is not None
    clock.advance(61)
    assert await store.get("a") is None
    assert store.size == 20  # expired entries are dropped as they are met


async def test_an_entry_over_its_cap_is_refused_and_evicts_nothing() -> None:
    store = LocalCacheStore(max_bytes=100, max_entries=10)
    assert await store.put("small", b"x" * 10, ttl=60, max_bytes=50)
    assert not await store.put("huge", b"y" * 51, ttl=60, max_bytes=50)
    assert not await store.put("huger", b"y" * 101, ttl=60, max_bytes=1000)
    assert await store.get("small") == b"x" * 10
    assert await store.get("huge") is None and len(store) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 40), st.booleans()), max_size=60)
)
def test_lru_bounds_hold_whatever_happens(ops: list[tuple[str, int, bool]]) -> None:
    async def run() -> None:
        store = LocalCacheStore(max_bytes=100, max_entries=4)
        model: dict[str, bytes] = {}
        for name, size, write in ops:
            if write:
                value = name.encode() * size
                if await store.put(name, value, ttl=60, max_bytes=60):
                    model[name] = value
            else:
                got = await store.get(name)
                assert got is None or got == model.get(name)
            assert store.size <= 100 and len(store) <= 4
            assert store.size == sum(len(v) for v in store._entries.values() for v in [v[1]])

    asyncio.run(run())


# -- replay and assembly -----------------------------------------------------------------


def chat_body(content: str, **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 123,
        "model": "sim-chat",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None, **message},
                "logprobs": None,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def chunks(stream: bytes) -> list[Any]:
    events = split_events(stream)
    assert events[-1] == b"data: [DONE]"
    return [orjson.loads(e[5:]) for e in events[:-1]]


def test_replay_is_role_content_finish_usage_done() -> None:
    text = "tok0 tok1 tok2 " * 20
    body = orjson.dumps(chat_body(text))
    plain = chunks(replay(CHAT, body, include_usage=False))
    assert plain[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1" for c in plain)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in plain) == text
    assert len(plain) > 3  # several content chunks, not one blob
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in plain)
    asked = chunks(replay(CHAT, body, include_usage=True))
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["total_tokens"] == 8


def test_assembling_a_replay_gives_back_the_answer() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    for body in (chat_body("hello there " * 30), chat_body("", tool_calls=calls)):
        if body["choices"][0]["message"]["content"] == "":
            body["choices"][0]["message"]["content"] = None
        stream = replay(CHAT, orjson.dumps(body), include_usage=True)
        again = assemble(CHAT, split_events(stream))
        assert again is not None and orjson.loads(again) == body


def test_text_completions_replay_and_assemble() -> None:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "text": "a b c " * 30, "logprobs": None, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    stream = replay("/completions", orjson.dumps(body), include_usage=True)
    assert all(c["object"] == "text_completion" for c in chunks(stream))
    assert orjson.loads(assemble("/completions", split_events(stream)) or b"") == body


def test_an_unfinished_or_failed_stream_is_not_assembled() -> None:
    events = split_events(replay(CHAT, orjson.dumps(chat_body("some text")), False))
    assert assemble(CHAT, events) is not None
    assert assemble(CHAT, events[:-1]) is None  # no [DONE]
    assert assemble(CHAT, [e for e in events if b'finish_reason":"stop' not in e]) is None
    error = b'data: {"error": {"message": "cut", "type": "api_error", "code": "stream_cut"}}'
    assert assemble(CHAT, [*events[:2], error]) is None
    assert assemble(CHAT, [*events[:2], b"data: {broken", *events[2:]]) is None


def test_only_complete_successful_answers_are_kept() -> None:
    assert is_complete(CHAT, chat_body("x"))
    unfinished = chat_body("x")
    unfinished["choices"][0]["finish_reason"] = None
    assert not is_complete(CHAT, unfinished)
    assert not is_complete(CHAT, {"error": {"message": "no"}})
    assert not is_complete(CHAT, {"choices": []})
    assert is_complete("/embeddings", {"data": [{"embedding": [0.1]}]})
    assert not is_complete("/embeddings", {"data": []})


def test_pieces_keep_every_character() -> None:
    text = "word " * 100 + "x" * 1000 + " end"
    parts = pieces(text)
    assert "".join(parts) == text and len(parts) > 5
    assert pieces("") == []


# -- single-flight -------------------------------------------------------------------------


async def test_one_leader_and_every_waiter_gets_its_answer() -> None:
    flight = SingleFlight()
    leaders = 0

    async def request() -> bytes | None:
        nonlocal leaders
        value, leads = await flight.wait("k", 5.0)
        if leads:
            leaders += 1
            await asyncio.sleep(0.01)
            flight.finish("k", b"answer")
            return b"answer"
        return value

    results = await asyncio.gather(*(request() for _ in range(20)))
    assert leaders == 1 and set(results) == {b"answer"} and len(flight) == 0


async def test_a_failed_leader_hands_the_turn_to_one_waiter() -> None:
    flight = SingleFlight()
    attempts = 0

    async def request(fail: bool) -> bytes | None:
        nonlocal attempts
        value, leads = await flight.wait("k", 5.0)
        if not leads:
            return value
        attempts += 1
        await asyncio.sleep(0.01)
        flight.finish("k", None if fail else b"second")
        return None if fail else b"second"

    results = await asyncio.gather(request(True), *(request(False) for _ in range(5)))
    assert attempts == 2 and results[0] is None and set(results[1:]) == {b"second"}


async def test_waiting_is_bounded() -> None:
    flight = SingleFlight()
    assert await flight.wait("k", 1.0) == (None, True)
    started = asyncio.get_running_loop().time()
    assert await flight.wait("k", 0.05) == (None, False)
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_lookup_statuses_and_coalesced_hit() -> None:
    cache = ResponseCache(LocalCacheStore())
    on = CacheSettings(coalesce=True)
    payload = dict(BASE)
    first = await cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT)
    assert first.status == MISS and first.body is None
    waiter = asyncio.create_task(cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT))
    await asyncio.sleep(0.01)
    await first.store(b'{"x":1}')
    follower = await waiter
    assert follower.status == HIT and follower.body == b'{"x":1}'
    assert (await cache.lookup(CHAT, "chat", payload, "k", on, DEFAULT)).status == HIT
    assert (await cache.lookup(CHAT, "chat", payload, "other", on, DEFAULT)).status == MISS
    shared = CacheSettings(scope="global")
    await (await cache.lookup(CHAT, "chat", payload, "a", shared, DEFAULT)).store(b"{}")
    assert (await cache.lookup(CHAT, "chat", payload, "b", shared, DEFAULT)).status == HIT
    refresh = await cache.lookup(CHAT, "chat", payload, "k", on, REFRESH)
    assert refresh.status == BYPASS and refresh.write
    off = await cache.lookup(CHAT, "chat", payload, "k", on, OFF)
    assert off.status == BYPASS and not off.write


# -- per-request control -------------------------------------------------------------------


def scope(value: bytes | None = None) -> dict[str, Any]:
    return {"headers": [(b"x-ballast-cache", value)] if value is not None else []}


def test_header_and_body_field_choose_the_mode() -> None:
    assert mode_of(scope(), None) == DEFAULT
    assert mode_of(scope(b"off"), None) == OFF
    assert mode_of(scope(b"Refresh"), None) == REFRESH
    assert mode_of(scope(b"off"), True) == OFF  # the header wins
    assert mode_of(scope(), False) == OFF
    assert mode_of(scope(), "refresh") == REFRESH
    assert mode_of(scope(), {"no-cache": True}) == REFRESH
    assert mode_of(scope(), {"no-store": True}) == NO_STORE
    assert mode_of(scope(), {"no-cache": True, "no-store": True}) == OFF
    for bad_header, bad_field in ((b"sometimes", None), (None, 3), (None, {"no-cache": "yes"})):
        with pytest.raises(ApiError) as info:
            mode_of(scope(bad_header), bad_field)
        assert info.value.status == 400


def test_the_cache_field_is_never_forwarded() -> None:
    payload = {**BASE, "cache": {"no-cache": True}}
    request = RequestContext(CHAT, payload, orjson.dumps(payload), "chat", False)
    assert take_field(request) == {"no-cache": True}
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    adapter = OpenAIAdapter(deployment, upstream, AdapterContext())
    sent = orjson.loads(adapter.body(request, request.model))
    assert "cache" not in sent and sent == BASE
    assert scope_of(None, request) == "anonymous"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "chat", "messages": []}',
        b'  {"model":"chat","messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"chat"}',
    ],
)
def test_added_fields_are_spliced_into_the_clients_bytes(raw: bytes) -> None:
    payload = orjson.loads(raw)
    request = RequestContext(CHAT, payload, raw, "chat", False)
    request.edits["stream"] = True
    request.edits["stream_options"] = {"include_usage": True}
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    adapter = OpenAIAdapter(
        deployment, Upstream(deployment, Timeouts(), UpstreamSettings()), AdapterContext()
    )
    sent = adapter.body(request, "chat")
    assert orjson.loads(sent) == {
        **payload,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert sent.endswith(raw.strip()[1:])  # the client's own bytes, after the added fields


def test_a_body_with_a_field_to_replace_or_remove_is_encoded_again() -> None:
    payload = {"model": "chat", "stream": False, "fallbacks": ["x"]}
    raw = orjson.dumps(payload)
    request = RequestContext(CHAT, payload, raw, "chat", False)
    request.edits.update({"stream": True, "fallbacks": None})
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    adapter = OpenAIAdapter(
        deployment, Upstream(deployment, Timeouts(), UpstreamSettings()), AdapterContext()
    )
    assert orjson.loads(adapter.body(request, "chat")) == {"model": "chat", "stream": True}

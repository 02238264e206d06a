"""Prompt-cache affinity: which conversation a request belongs to, the bounded map of the
deployment that answered it last, and the attempt loop keeping to it while it is ready."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ballast.config import parse_settings
from ballast.pipeline.context import RequestContext
from ballast.resilience import failures
from ballast.resilience.clock import ManualClock
from ballast.resilience.failures import Failure
from ballast.routing.affinity import Affinity, conversation, group_key
from ballast.routing.attempt import Attempt
from ballast.routing.router import Router

URL = "http://127.0.0.1:9/v1"
SYSTEM = {"role": "system", "content": "You review code."}
FIRST = {"role": "user", "content": "Look at this diff."}


# -- the conversation's key --------------------------------------------------------------


def test_a_chat_conversation_keeps_its_key_as_it_grows() -> None:
    turn1 = {"messages": [SYSTEM, FIRST]}
    turn2 = {"messages": [SYSTEM, FIRST, {"role": "assistant", "content": "ok"}, FIRST]}
    other = {"messages": [SYSTEM, {"role": "user", "content": "Another diff."}]}
    key = conversation("/chat/completions", turn1)
    assert key is not None
    assert conversation("/chat/completions", turn2) == key
    assert conversation("/chat/completions", other) != key
    # Without a system prompt the first message alone names it; the answer after it does not.
    bare = [FIRST, {"role": "assistant", "content": "ok"}]
    assert conversation("/chat/completions", {"messages": bare}) == conversation(
        "/chat/completions", {"messages": [FIRST]}
    )


def test_a_key_the_client_gives_wins_over_the_prompt() -> None:
    one = {"messages": [SYSTEM, FIRST], "prompt_cache_key": "conv-1"}
    two = {"messages": [FIRST], "prompt_cache_key": "conv-1"}
    assert conversation("/chat/completions", one) == conversation("/chat/completions", two)
    assert conversation("/responses", {"input": "x", "prompt_cache_key": "conv-1"}) == (
        conversation("/chat/completions", one)
    )
    user = {"messages": [FIRST], "user": "u-7"}
    assert conversation("/chat/completions", user) == hash("u-7")
    messages = {"messages": [FIRST], "metadata": {"user_id": "u-7"}}
    assert conversation("/messages", messages) == hash("u-7")


def test_messages_ignore_the_cache_marks_a_client_moves_each_turn() -> None:
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You review code.", "cache_control": mark}]

    def block(text: str, marked: bool) -> dict[str, Any]:
        return {"type": "text", "text": text, **({"cache_control": mark} if marked else {})}

    turn1 = {"system": system, "messages": [{"role": "user", "content": [block("a", True)]}]}
    turn2 = {
        "system": system,
        "messages": [
            {"role": "user", "content": [block("a", False)]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [block("b", True)]},
        ],
    }
    assert conversation("/messages", turn1) == conversation("/messages", turn2)
    other = {"system": system, "messages": [{"role": "user", "content": [block("c", True)]}]}
    assert conversation("/messages", other) != conversation("/messages", turn1)
    image = {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
    marked = [{"role": "user", "content": [{**image, "cache_control": mark}]}]
    plain = [{"role": "user", "content": [image]}]
    assert conversation("/messages", {"messages": marked}) == conversation(
        "/messages", {"messages": plain}
    )


def test_responses_are_told_by_instructions_and_the_first_item() -> None:
    first = {"role": "user", "content": "Look at this diff."}
    turn1 = {"instructions": "Review.", "input": [first]}
    turn2 = {"instructions": "Review.", "input": [first, {"type": "function_call_output"}]}
    assert conversation("/responses", turn1) == conversation("/responses", turn2)
    assert conversation("/responses", {"instructions": "Other.", "input": [first]}) != (
        conversation("/responses", turn1)
    )
    assert conversation("/responses", {"input": "hi"}) is not None


def test_requests_without_a_conversation_have_no_key() -> None:
    assert conversation("/embeddings", {"input": "x"}) is None
    assert conversation("/completions", {"prompt": "x"}) is None
    assert conversation("/chat/completions", {"messages": []}) is None


# -- the map -----------------------------------------------------------------------------


def test_the_map_forgets_after_its_ttl_and_past_its_size() -> None:
    clock = ManualClock()
    affinity = Affinity(limit=2, ttl=10.0, clock=clock)
    affinity.served(1, "a")
    clock.advance(9.9)
    assert affinity.get(1) == "a"
    clock.advance(0.1)
    assert affinity.get(1) is None and len(affinity) == 0
    affinity.served(1, "a")
    affinity.served(2, "b")
    affinity.served(1, "a")  # answered again: now the most recent
    affinity.served(3, "c")
    assert (affinity.get(1), affinity.get(2), affinity.get(3)) == ("a", None, "c")
    assert len(affinity) == 2


# -- the attempt loop --------------------------------------------------------------------


def make_router(**group: Any) -> tuple[Router, ManualClock]:
    clock = ManualClock()
    settings = parse_settings(
        {
            "routing": {"backoff_base": 0},
            "models": [
                {
                    "name": "chat",
                    "deployments": [{"id": "a", "url": URL}, {"id": "b", "url": URL}],
                    **group,
                },
                {"name": "solo", "deployments": [{"id": "s", "url": URL}]},
            ],
        }
    )
    return Router(settings, clock, random.Random(3)), clock


def request(key: str, model: str = "chat") -> RequestContext:
    payload = {"model": model, "messages": [FIRST], "prompt_cache_key": key}
    return RequestContext("/chat/completions", payload, b"{}", model, False)


async def ask(router: Router, ctx: RequestContext, down: frozenset[str] = frozenset()) -> str:
    async def exchange(attempt: Attempt, model: str) -> str:
        if attempt.id in down:
            raise Failure(failures.SERVER_ERROR, "upstream answered 500", status=500)
        attempt.succeeded()
        return attempt.id

    group = router.resolve(ctx.model)
    assert group is not None
    return await router.loop.run(ctx, group, router.loop.begin(), exchange)


async def test_a_conversation_keeps_to_the_deployment_that_answered_it() -> None:
    router, _ = make_router()
    first = {key: await ask(router, request(key)) for key in map(str, range(20))}
    assert set(first.values()) == {"a", "b"}  # new conversations are spread as before
    for _ in range(3):
        for key, deployment in first.items():
            assert await ask(router, request(key)) == deployment


async def test_without_affinity_the_strategy_alone_decides() -> None:
    router, _ = make_router(affinity="off")
    answers = [await ask(router, request("same")) for _ in range(40)]
    assert set(answers) == {"a", "b"}
    assert len(router.loop.affinity) == 0
    ordered, _ = make_router(strategy="ordered")  # its default: off
    await ask(ordered, request("k"), down=frozenset({"a"}))
    assert len(ordered.loop.affinity) == 0


@pytest.mark.parametrize("trouble", ["breaker", "cooling", "drained", "half_open", None])
def test_only_a_ready_deployment_is_put_first(trouble: str | None) -> None:
    router, clock = make_router()
    group = router.resolve("chat")
    assert group is not None
    a, b = router.targets["a"], router.targets["b"]
    affinity = router.loop.affinity
    affinity.answered(a, 42, [a, b])
    if trouble == "breaker":
        a.breaker.force_open(30.0)
    elif trouble == "cooling":
        a.cooling_until = clock.monotonic() + 30.0
    elif trouble == "drained":
        a.drained = True
    elif trouble == "half_open":
        a.breaker.force_open(1.0)
        clock.advance(1.0)  # one trial may go, where the strategy puts it, not by preference
    expected = [b, a] if trouble else [a, b]
    assert affinity.order(group, [b, a], 42) == expected
    assert affinity.order(group, [b, a], 43) == [b, a]  # another conversation


async def test_an_open_preferred_deployment_is_passed_over_and_the_answer_moves_it() -> None:
    router, _ = make_router()
    keys = [str(k) for k in range(40)]
    on_a = [k for k in keys if await ask(router, request(k)) == "a"]
    assert on_a
    router.targets["a"].breaker.force_open(30.0)
    assert {await ask(router, request(k)) for k in on_a} == {"b"}
    assert {await ask(router, request(k)) for k in on_a} == {"b"}  # kept there while a is out


async def test_a_stand_in_keeps_a_conversation_only_until_the_one_it_covered_is_back() -> None:
    router, _ = make_router()
    keys = [str(k) for k in range(40)]
    on_a = [k for k in keys if await ask(router, request(k)) == "a"]
    router.targets["a"].breaker.force_open(30.0)
    assert {await ask(router, request(k)) for k in on_a} == {"b"}
    router.targets["a"].breaker.reset()
    # Back: the strategy decides again (a stand-in's answer does not outlast the recovery),
    # and where it puts a conversation now, the conversation keeps to.
    again = {k: await ask(router, request(k)) for k in on_a}
    assert "a" in again.values()
    for key, deployment in again.items():
        assert await ask(router, request(key)) == deployment


def test_an_answer_while_part_of_the_group_is_out_names_what_was_out() -> None:
    router, clock = make_router()
    group = router.resolve("chat")
    assert group is not None
    a, b = router.targets["a"], router.targets["b"]
    affinity = router.loop.affinity
    a.cooling_until = clock.monotonic() + 10.0
    affinity.answered(b, 7, [a, b])
    assert affinity.order(group, [a, b], 7) == [b, a]  # a still cools: b keeps it
    clock.advance(10.0)
    assert affinity.order(group, [a, b], 7) == [a, b]  # a is back: the strategy's order
    assert len(affinity) == 0


async def test_an_answer_after_a_failover_is_not_kept() -> None:
    router, _ = make_router()
    keys = [str(k) for k in range(20)]
    on_a = [k for k in keys if await ask(router, request(k)) == "a"]
    assert on_a
    key = on_a[0]
    kept = group_key("chat", hash(key))
    assert router.loop.affinity.get(kept) == "a"
    assert await ask(router, request(key), down=frozenset({"a"})) == "b"
    assert router.loop.affinity.get(kept) is None  # the strategy, having seen a fail, decides
    answered = await ask(router, request(key))
    assert router.loop.affinity.get(kept) == answered


async def test_a_group_of_one_reads_no_key_and_keeps_nothing() -> None:
    router, _ = make_router()
    ctx = request("k", model="solo")
    attempts = router.loop.begin()

    async def exchange(attempt: Attempt, model: str) -> str:
        attempt.succeeded()
        return attempt.id

    group = router.resolve("solo")
    assert group is not None
    assert await router.loop.run(ctx, group, attempts, exchange) == "s"
    assert not attempts.keyed and len(router.loop.affinity) == 0


async def test_the_same_conversation_keeps_a_deployment_per_model_group() -> None:
    clock = ManualClock()
    deployments = [{"id": "a", "url": URL}, {"id": "b", "url": URL}]
    others = [{"id": "c", "url": URL}, {"id": "d", "url": URL}]
    settings = parse_settings(
        {
            "models": [
                {"name": "large", "deployments": deployments},
                {"name": "small", "deployments": others},
            ]
        }
    )
    router = Router(settings, clock, random.Random(5))
    large = await ask(router, request("k", "large"))
    small = await ask(router, request("k", "small"))
    for _ in range(5):
        assert await ask(router, request("k", "large")) == large
        assert await ask(router, request("k", "small")) == small

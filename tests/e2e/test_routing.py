"""Resilient routing against real simulators, through the official openai SDK.

Each test names the behaviour a user would notice: failover, cooldown, continuation of a
broken stream, fast 503s when nothing can answer, recovery, pass-through of refusals.
Timeouts are short (first token 0.5 s, gap between chunks 0.5 s) so faults cost little."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from tests.stack import Gateway, Stack, deployment, group, wait_for

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
FAST = {"connect": 1.0, "first_token": 0.5, "inter_chunk": 0.5, "answer": 1.0, "request": 20.0}


def full(tokens: int) -> str:
    return "".join(f"tok{i} " for i in range(tokens))


def config(*groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    routing = extra.pop("routing", {})
    return {
        "timeouts": {**FAST, **extra.pop("timeouts", {})},
        "routing": routing,
        "models": list(groups),
        **extra,
    }


def client(gateway: Gateway, timeout: float = 20.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0, timeout=timeout
    )


def served_by(fingerprint: str | None) -> str:
    assert fingerprint is not None and fingerprint.startswith("sim:")
    return fingerprint[4:]


def chat(api: openai.OpenAI, model: str = "chat", **kw: Any) -> Any:
    return api.chat.completions.create(model=model, messages=MESSAGES, **kw)


def stream_chat(api: openai.OpenAI, model: str = "chat", **kw: Any) -> tuple[str, str, str | None]:
    """(text, name of the sim that sent the first chunk, finish_reason)."""
    text, first, finish = "", "", None
    for chunk in api.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kw):
        if not first and chunk.system_fingerprint:
            first = served_by(chunk.system_fingerprint)
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, first, finish


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """A raw POST (status, body), to compare bytes with what an upstream says directly."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def ordered(name: str, *deployments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return group(name, *deployments, strategy="ordered", **extra)


# -- 429 and Retry-After ---------------------------------------------------------------


def test_429_with_retry_after_cools_the_deployment_and_clients_never_notice(stack: Stack) -> None:
    a = stack.sim("429?retry_after=30", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    api = client(gateway)
    for i in range(40):
        stream = i % 2 == 1
        if stream:
            text, who, _ = stream_chat(api)
        else:
            reply = chat(api)
            text, who = reply.choices[0].message.content, served_by(reply.system_fingerprint)
        assert text == full(16)
        assert who == "b"
    # "ordered" puts a first every time: only the cooldown keeps requests away from it.
    assert len(stack.attempts(a)) == 1
    assert len(stack.attempts(b)) == 40


def test_traffic_returns_to_a_cooled_deployment_after_retry_after(stack: Stack) -> None:
    a = stack.sim("429?retry_after=1", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    api = client(gateway)
    started = time.monotonic()
    assert served_by(chat(api).system_fingerprint) == "b"
    stack.set_behaviour(a, "ok")
    returned_at = None
    while time.monotonic() - started < 3.0:
        who = served_by(chat(api).system_fingerprint)
        if who == "a":
            returned_at = time.monotonic() - started
            break
        time.sleep(0.05)
    assert returned_at is not None, "traffic never came back to the cooled deployment"
    assert 0.9 <= returned_at <= 1.5
    assert len(stack.attempts(a)) == 2  # the 429, then the first request after the window


# -- a deployment that never answers --------------------------------------------------


def test_hanging_deployment_fails_over_after_first_token_when_streaming(stack: Stack) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    api = client(gateway)
    for _ in range(2):
        started = time.monotonic()
        text, who, finish = stream_chat(api)
        elapsed = time.monotonic() - started
        assert (text, who, finish) == (full(16), "b", "stop")
        assert 0.5 <= elapsed <= 0.5 + 1.0
    assert len(stack.attempts(a)) == 2


def test_hanging_deployment_fails_over_after_answer_timeout_when_not_streaming(
    stack: Stack,
) -> None:
    a = stack.sim("hang", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b)),
            timeouts={"answer": 0.5},
        )
    )
    api = client(gateway)
    started = time.monotonic()
    reply = chat(api)
    elapsed = time.monotonic() - started
    assert served_by(reply.system_fingerprint) == "b"
    assert reply.choices[0].message.content == full(16)
    assert 0.5 <= elapsed <= 0.5 + 1.0
    assert len(stack.attempts(a)) == 1


# -- stream recovery ------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "regenerate"])
def test_broken_stream_is_continued_on_another_deployment(
    stack: Stack, fault: str, prefill: bool
) -> None:
    a = stack.sim(fault, name="a")
    b = stack.sim("ok?tokens=60", name="b")
    gateway = stack.gateway(
        config(
            ordered(
                "chat",
                deployment("a", a),
                deployment("b", b, supports_prefill=prefill),
            )
        )
    )
    api = client(gateway)
    text, who, finish = stream_chat(api, stream_options={"include_usage": True})
    assert text == full(60)  # one whole answer, no repeated or missing token
    assert who == "a" and finish == "stop"
    (continued,) = stack.attempts(b)
    assert continued["prefill"] is prefill
    sent_by_a = 20 if fault.startswith("stall") else 40
    assert stack.attempts(a)[0]["tokens"] == sent_by_a
    if prefill:
        assert continued["tokens"] == 60 - sent_by_a  # only the remainder was generated


@pytest.mark.parametrize("fault", ["stall?after=20&seconds=60&tokens=60", "cut?after=40&tokens=60"])
def test_broken_stream_without_continuation_ends_with_a_clean_error(
    stack: Stack, fault: str
) -> None:
    a = stack.sim(fault, name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    api = client(gateway)
    text, last = "", time.monotonic()
    with pytest.raises(openai.APIError) as info:
        for chunk in chat(api, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                last = time.monotonic()
    waited = time.monotonic() - last
    sent_by_a = 20 if fault.startswith("stall") else 40
    assert text == full(sent_by_a)
    assert waited <= 0.5 + 1.0
    if fault.startswith("stall"):
        assert waited >= 0.4  # the inter-chunk clock, not an instant failure
        assert "upstream_stalled" in str(info.value.body)
    else:
        assert "upstream_stream_cut" in str(info.value.body)
    # The gateway is fine afterwards: the next request is served normally.
    stack.set_behaviour(a, "ok?tokens=60")
    text, who, finish = stream_chat(api)
    assert (text, who, finish) == (full(60), "a", "stop")
    assert chat(api).choices[0].message.content == full(60)


def test_a_continuation_that_says_something_else_ends_with_the_original_fault(
    stack: Stack,
) -> None:
    a = stack.sim("stall?after=20&seconds=60&tokens=60", name="a")
    b = stack.sim("ok?tokens=10", name="b")  # regenerates a shorter, different answer
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    text = ""
    with pytest.raises(openai.APIError) as info:
        for chunk in chat(client(gateway), stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                assert chunk.choices[0].finish_reason is None
    assert text == full(20)
    assert "upstream_stalled" in str(info.value.body)  # the stall, not the continuation
    assert len(stack.attempts(b)) == 1


# -- flaky upstreams -------------------------------------------------------------------


def test_random_500s_on_every_deployment_are_absorbed_by_retries(stack: Stack) -> None:
    a = stack.sim("500?mode=random&p=0.3&seed=1", name="a")
    b = stack.sim("500?mode=random&p=0.3&seed=2", name="b")
    gateway = stack.gateway(
        {"timeouts": FAST, "models": [group("chat", deployment("a", a), deployment("b", b))]}
    )
    api = client(gateway)
    ok = 0
    total = 400
    for i in range(total):
        try:
            if i % 2:
                text, _, _ = stream_chat(api)
            else:
                text = chat(api).choices[0].message.content or ""
        except openai.APIError:
            continue
        ok += text == full(16)
    assert ok / total >= 0.99
    outcomes = [e["outcome"] for e in stack.attempts(a) + stack.attempts(b)]
    failed = outcomes.count("500")
    assert failed > 0.2 * len(outcomes)  # the faults really happened


# -- total outage ----------------------------------------------------------------------


def test_full_outage_answers_503_at_once_after_the_breakers_open(stack: Stack) -> None:
    a = stack.sim("500", name="a")
    b = stack.sim("500", name="b")
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a), deployment("b", b)),
            routing={"breaker": {"failure_threshold": 2, "open_time": 10}},
        )
    )
    api = client(gateway)
    for _ in range(3):
        with pytest.raises(openai.APIStatusError):
            chat(api)
    attempts_before = len(stack.attempts(a)) + len(stack.attempts(b))
    latencies = []
    for i in range(30):
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            if i % 2:
                stream_chat(api)
            else:
                chat(api)
        latencies.append(time.monotonic() - started)
        error = info.value
        assert error.status_code == 503
        assert error.code == "no_healthy_deployment"
        assert 1 <= int(error.response.headers["retry-after"]) <= 10
    latencies.sort()
    assert latencies[-1] < 0.05, latencies
    # An open breaker fails without touching the network.
    assert len(stack.attempts(a)) + len(stack.attempts(b)) == attempts_before


def test_retry_budget_bounds_upstream_load_during_an_outage(stack: Stack) -> None:
    a = stack.sim("500", name="a")
    b = stack.sim("500", name="b")
    ratio = 0.2
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a), deployment("b", b)),
            # Breakers that never open: the budget alone must bound the load.
            routing={
                "retry_budget_ratio": ratio,
                "retry_budget_min_per_second": 0,
                "backoff_base": 0.001,
                "breaker": {"failure_threshold": 100000, "failure_rate": None},
            },
        )
    )
    api = client(gateway)
    requests = 60
    for i in range(requests):
        with pytest.raises(openai.APIStatusError) as info:
            if i % 2:
                stream_chat(api)
            else:
                chat(api)
        assert info.value.status_code == 502
    upstream = len(stack.attempts(a)) + len(stack.attempts(b))
    assert requests < upstream <= (1 + ratio) * requests


# -- recovery ----------------------------------------------------------------------------


def test_traffic_returns_to_a_recovered_deployment_within_open_time_plus_one_probe(
    stack: Stack,
) -> None:
    a = stack.sim("500", name="a")
    b = stack.sim("ok", name="b")
    open_time = 0.5
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b)),
            routing={"breaker": {"failure_threshold": 2, "open_time": open_time}},
        )
    )
    api = client(gateway)
    for _ in range(2):
        assert served_by(chat(api).system_fingerprint) == "b"
    opened = time.monotonic()
    assert gateway.router.targets["a"].breaker.state.value == "open"
    stack.set_behaviour(a, "ok")
    failed_attempts = len(stack.attempts(a))
    back = None
    while time.monotonic() - opened < 3:
        if served_by(chat(api).system_fingerprint) == "a":
            back = time.monotonic() - opened
            break
        time.sleep(0.02)
    assert back is not None
    assert open_time - 0.05 <= back <= open_time + 0.3
    # Exactly one probe, and it was the request that came back.
    assert len(stack.attempts(a)) == failed_attempts + 1
    assert gateway.router.targets["a"].breaker.state.value == "closed"


def test_a_hung_half_open_probe_releases_its_lease_after_probe_timeout(stack: Stack) -> None:
    a = stack.sim("500", name="a")
    probe_timeout = 0.5
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a)),
            timeouts={"answer": 1.5},  # the probe stays hung well past probe_timeout
            routing={
                "breaker": {
                    "failure_threshold": 1,
                    "open_time": 0.3,
                    "probe_timeout": probe_timeout,
                }
            },
        )
    )
    api = client(gateway)
    with pytest.raises(openai.APIStatusError):
        chat(api)
    breaker = gateway.router.targets["a"].breaker
    assert breaker.state.value == "open"
    stack.set_behaviour(a, "hang")
    time.sleep(0.35)

    hung: list[BaseException] = []

    def probe() -> None:
        try:
            chat(api)
        except BaseException as exc:
            hung.append(exc)

    thread = threading.Thread(target=probe)
    thread.start()
    deadline = time.monotonic() + 2
    while len(stack.attempts(a)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    probe_started = time.monotonic()
    assert len(stack.attempts(a)) == 2  # the probe is out, and it hangs
    stack.set_behaviour(a, "ok")
    # While the probe holds its lease, nothing else is let through.
    with pytest.raises(openai.APIStatusError) as info:
        chat(api)
    assert info.value.status_code == 503
    served_at = None
    while time.monotonic() - probe_started < 2:
        try:
            reply = chat(api)
        except openai.APIStatusError:
            time.sleep(0.02)
            continue
        assert served_by(reply.system_fingerprint) == "a"
        served_at = time.monotonic() - probe_started
        break
    assert served_at is not None, "a stuck probe kept the deployment blocked"
    assert served_at <= probe_timeout + 0.3
    assert breaker.state.value == "closed"
    thread.join(5)
    assert hung and isinstance(hung[0], openai.APIStatusError)


# -- refusals: context length, content filter, other 4xx -----------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_context_length_is_served_by_the_context_fallback(stack: Stack, stream: bool) -> None:
    small = stack.sim("context_length", name="small")
    big = stack.sim("ok", name="big")
    gateway = stack.gateway(
        config(
            group(
                "chat",
                deployment("s1", small, model="sim-small"),
                deployment("s2", small, model="sim-small"),
                context_fallbacks=["chat-long"],
            ),
            group("chat-long", deployment("l", big, model="sim-long")),
        )
    )
    api = client(gateway)
    if stream:
        chunks = list(chat(api, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert {c.model for c in chunks} == {"sim-long"}
    else:
        reply = chat(api)
        text = reply.choices[0].message.content or ""
        assert reply.model == "sim-long"
    assert text == full(16)
    # Never the same model again: one refusal, then the larger model.
    assert len(stack.attempts(small)) == 1
    assert len(stack.attempts(big)) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_content_filter_reaches_the_client_after_one_attempt(stack: Stack, stream: bool) -> None:
    a = stack.sim("content_filter?reason=violence", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", a), deployment("b", b), fallbacks=["other"]),
            group("other", deployment("o", b)),
        )
    )
    api = client(gateway)
    with pytest.raises(openai.BadRequestError) as info:
        if stream:
            stream_chat(api)
        else:
            chat(api)
    assert info.value.code == "content_filter"
    assert "violence" in info.value.message
    assert len(stack.attempts(a)) == 1
    assert stack.attempts(b) == []


@pytest.mark.parametrize("stream", [False, True])
def test_other_4xx_pass_through_unchanged_after_one_attempt(stack: Stack, stream: bool) -> None:
    a = stack.sim("409?code=something_else", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    body = {"model": "chat", "messages": MESSAGES, "stream": stream}
    direct = post(a.url + "/v1/chat/completions", body)
    stack.clear_log(a)
    answer = post(gateway.url + "/v1/chat/completions", body)
    assert answer[0] == direct[0] == 409
    assert answer[1] == direct[1]
    assert len(stack.attempts(a)) == 1
    assert stack.attempts(b) == []


def test_upstream_auth_failure_fails_over_and_cools_down(stack: Stack) -> None:
    a = stack.sim("401", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(config(ordered("chat", deployment("a", a), deployment("b", b))))
    api = client(gateway)
    assert served_by(chat(api).system_fingerprint) == "b"
    # The refusal alone fails over; the probe, made with the deployment's own key and
    # refused as well, is what cools it down.
    breaker = gateway.router.targets["a"].breaker
    wait_for(lambda: breaker.state.value == "open")
    for _ in range(4):
        assert served_by(chat(api).system_fingerprint) == "b"
    assert len(stack.attempts(a)) == 1


# -- fallbacks ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["request", "group"])
@pytest.mark.parametrize("stream", [False, True])
def test_fallbacks_answer_and_the_response_names_the_model_that_did(
    stack: Stack, where: str, stream: bool
) -> None:
    down = stack.sim("503", name="down")
    up = stack.sim("ok", name="up")
    primary: dict[str, Any] = {"fallbacks": ["backup"]} if where == "group" else {}
    gateway = stack.gateway(
        config(
            group("chat", deployment("p", down, model="sim-primary"), **primary),
            group("backup", deployment("f", up, model="sim-backup")),
            routing={"retry_budget_min_per_second": 100},
        )
    )
    api = client(gateway)
    extra: dict[str, Any] = {"extra_body": {"fallbacks": ["backup"]}} if where == "request" else {}
    if stream:
        chunks = list(chat(api, stream=True, stream_options={"include_usage": True}, **extra))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert {c.model for c in chunks} == {"sim-backup"}
        usage = [c.usage for c in chunks if c.usage]
        assert len(usage) == 1 and usage[0].completion_tokens == 16
    else:
        reply = chat(api, **extra)
        text = reply.choices[0].message.content or ""
        assert reply.model == "sim-backup"
        assert reply.usage is not None and reply.usage.completion_tokens == 16
    assert text == full(16)
    assert stack.attempts(down)  # the primary really was tried first
    # The fallback was asked for its own model name, not the client's.
    assert [e["model"] for e in stack.attempts(up)] == ["sim-backup"]


def test_a_short_retry_after_on_the_primary_is_waited_for_before_another_model(
    stack: Stack,
) -> None:
    primary = stack.sim("429?retry_after=0.5&mode=once", name="primary")
    other = stack.sim("ok", name="other")
    gateway = stack.gateway(
        config(
            group("chat", deployment("p", primary), fallbacks=["other"]),
            group("other", deployment("o", other)),
        )
    )
    started = time.monotonic()
    reply = chat(client(gateway))
    assert served_by(reply.system_fingerprint) == "primary"
    assert 0.45 <= time.monotonic() - started <= 1.5
    assert stack.attempts(other) == []


def test_without_fallbacks_the_same_outage_is_an_error(stack: Stack) -> None:
    down = stack.sim("503", name="down")
    up = stack.sim("ok", name="up")
    gateway = stack.gateway(
        config(
            group("chat", deployment("p", down)),
            group("backup", deployment("f", up)),
        )
    )
    with pytest.raises(openai.APIStatusError):
        chat(client(gateway))
    assert stack.attempts(up) == []


# -- client disconnect -----------------------------------------------------------------


def _wait_disconnected(stack: Stack, sim: Any, within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within + 1:
        attempts = stack.attempts(sim)
        if attempts and attempts[-1]["disconnected"]:
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError("the upstream request was never cancelled")


def test_client_disconnect_mid_stream_cancels_the_upstream_request(stack: Stack) -> None:
    a = stack.sim("ok?tokens=200&delay=0.02", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    stream = chat(client(gateway), stream=True)
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got == 5:
                break
    stream.close()
    assert _wait_disconnected(stack, a, within=1.0) <= 1.0
    time.sleep(0.1)
    assert stack.attempts(a)[-1]["tokens"] < 100  # no tokens generated for nobody


def test_client_disconnect_while_waiting_cancels_the_upstream_request(stack: Stack) -> None:
    a = stack.sim("slow_first?delay=30", name="a")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a)), timeouts={"first_token": 30, "answer": 30})
    )
    with pytest.raises(openai.APITimeoutError):
        chat(client(gateway, timeout=0.3))
    assert _wait_disconnected(stack, a, within=1.0) <= 1.0


# -- damaged streams ---------------------------------------------------------------------


def test_a_malformed_chunk_is_skipped(stack: Stack) -> None:
    a = stack.sim("malformed?at=3&tokens=10", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    text, who, finish = stream_chat(client(gateway))
    # The broken event (token 2) is dropped; everything else arrives and the stream ends well.
    assert text == full(10).replace("tok2 ", "")
    assert (who, finish) == ("a", "stop")


def test_a_stream_without_done_is_finalised(stack: Stack) -> None:
    a = stack.sim("no_done?tokens=10", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    text, _, finish = stream_chat(client(gateway))
    assert (text, finish) == (full(10), "stop")
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    started = time.monotonic()
    status, raw = post(gateway.url + "/v1/chat/completions", body)
    assert time.monotonic() - started < 0.5  # not held until the inter-chunk clock
    assert status == 200
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b"error" not in raw

"""Hostile upstreams and clients over real sockets: upstream garbage (HTML pages, non-JSON
200s, truncated gzip, the wrong content-type) is an upstream error of the taxonomy (failover,
then a clean 502), never a crash; hostile requests get a clear 4xx."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ballast.sim.server import SimServer
from tests.e2e.test_routing import MESSAGES, client, config, full, ordered, post, stream_chat
from tests.hostile import (
    MB,
    HostileUpstream,
    Sampler,
    gateway_process,
    hostile_upstream,
    rss,
)
from tests.stack import Stack, deployment

GARBAGE = ["html", "html?status=200", "gzip_truncated", "wrong_type", "malformed"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("behaviour", GARBAGE)
def test_upstream_garbage_fails_over_to_a_healthy_deployment(
    stack: Stack, behaviour: str, stream: bool
) -> None:
    bad = stack.sim(behaviour, name="bad")
    good = stack.sim("ok?tokens=5", name="good")
    gw = stack.gateway(
        config(ordered("chat", deployment("a", bad, "m"), deployment("b", good, "m")))
    )
    api = client(gw)
    if stream:
        text, _, finish = stream_chat(api)
        assert finish == "stop"
    else:
        reply = api.chat.completions.create(model="chat", messages=MESSAGES)
        text = reply.choices[0].message.content or ""
    # "malformed" breaks only one chunk of a stream (skipped), and a whole answer is asked
    # for as a stream too (routing.answers_as_streams): it is served by the first deployment.
    served_by_bad = behaviour == "malformed"
    assert text.endswith(full(16)[-12:] if served_by_bad else full(5))
    assert len(stack.attempts(bad)) == 1
    assert len(stack.attempts(good)) == (0 if served_by_bad else 1)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("behaviour", ["html", "html?status=200", "gzip_truncated"])
def test_upstream_garbage_with_nowhere_else_to_go_is_a_clean_502(
    stack: Stack, behaviour: str, stream: bool
) -> None:
    bad = stack.sim(behaviour, name="bad")
    gw = stack.gateway(
        config(ordered("chat", deployment("a", bad, "m")), routing={"max_attempts": 2})
    )
    status, body = post(
        gw.url + "/v1/chat/completions", {"model": "chat", "messages": MESSAGES, "stream": stream}
    )
    assert status in (502, 503, 504)
    error = json.loads(body)["error"]
    assert error["type"] == "api_error"
    assert error["code"].startswith("upstream_") or error["code"] == "no_healthy_deployment"
    assert b"<html>" not in body  # the page itself never reaches the client


def test_wrong_content_type_is_relabelled_as_json(stack: Stack) -> None:
    sim = stack.sim("wrong_type?tokens=3")
    # A whole answer asked for as such (not as a stream), with a body labelled wrongly.
    gw = stack.gateway(
        config(ordered("chat", deployment("a", sim, "m")), routing={"answers_as_streams": False})
    )
    request = {"model": "chat", "messages": MESSAGES}
    req = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=json.dumps(request).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as response:
        assert response.headers["content-type"] == "application/json"
        assert json.loads(response.read())["choices"][0]["message"]["content"] == full(3)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "chat", "messages": MESSAGES, "n": 0}, 400, "n"),
        ({"model": "chat", "messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "chat", "messages": MESSAGES, "max_tokens": 10**12}, 400, "max_tokens"),
    ],
)
def test_out_of_range_counts_are_400_naming_the_param(
    stack: Stack, body: dict[str, object], status: int, param: str
) -> None:
    sim = stack.sim("ok")
    gw = stack.gateway(config(ordered("chat", deployment("a", sim, "m"))))
    got, raw = post(gw.url + "/v1/chat/completions", body)
    assert got == status
    assert json.loads(raw)["error"]["param"] == param
    assert stack.attempts(sim) == []  # never reached an upstream


def _raw_request(port: int, head: bytes, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(
                head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (e.g. 413) and close before the body is all sent
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass  # an answer already read is what counts
    return data


def test_deep_json_invalid_utf8_huge_bodies_and_forms_get_4xx_over_the_wire(stack: Stack) -> None:
    sim = stack.sim("ok")
    gw = stack.gateway(
        config(ordered("chat", deployment("a", sim, "m")), server={"max_body_bytes": 65536})
    )
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    json_head = head + b"content-type: application/json\r\n"
    cases = [
        (json_head, b"[" * 3000 + b"]" * 3000, b"400"),
        (json_head, b'{"model":"chat\xff","messages":[]}', b"400"),
        (json_head, b"{" + b" " * 70000 + b"}", b"413"),
        (head + b"content-type: application/x-www-form-urlencoded\r\n", b"model=chat", b"415"),
        (head + b"content-type: multipart/form-data; boundary=z\r\n", b"--z--", b"415"),
    ]
    for request_head, body, expected in cases:
        answer = _raw_request(gw.port, request_head, body)
        assert answer.split(b" ", 2)[1] == expected, answer[:200]
        assert b'"error"' in answer
    assert stack.attempts(sim) == []


# -- upstreams that would take all memory ----------------------------------------------


def _hostile_config(upstream: HostileUpstream, sim: SimServer) -> dict[str, Any]:
    def hostile(dep_id: str, mode: str) -> dict[str, Any]:
        return {"id": dep_id, "url": upstream.url(mode), "api_key": "sk-h", "probe": "none"}

    solo = [
        ordered(f"solo-{mode}", hostile(mode, mode)) for mode in ("huge", "bomb", "endless_sse")
    ]
    pair = ordered("pair", hostile("huge-first", "huge"), deployment("good", sim, "m"))
    return config(
        *solo,
        pair,
        ordered("ok", deployment("ok", sim, "m")),
        timeouts={"first_token": 10.0, "answer": 10.0, "inter_chunk": 10.0},
        routing={"max_attempts": 2},
        upstream={"max_response_bytes": 4 * MB, "max_event_bytes": MB},
    )


def _settle(pid: int, port: int, rounds: int = 30) -> int:
    """The gateway's RSS once a few ordinary requests went through it."""
    for _ in range(rounds):
        status, _ = post(f"http://127.0.0.1:{port}/v1/chat/completions", _ask("ok"))
        assert status == 200
    return rss(pid)


def _ask(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "stream": stream}


def test_huge_answers_gzip_bombs_and_endless_events_cost_bounded_memory(
    stack: Stack, tmp_path: Path
) -> None:
    upstream = hostile_upstream(stack)
    sim = stack.sim("ok?tokens=5")
    with gateway_process(tmp_path, _hostile_config(upstream, sim)) as (pid, port):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        baseline = _settle(pid, port)
        sampler = Sampler(pid, port)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        try:
            # (A stream asked of an upstream that answers JSON ends at its headers.)
            for mode, stream, limit in [
                ("huge", False, "max_response_bytes (4194304 bytes)"),
                ("bomb", False, "max_response_bytes (4194304 bytes)"),
                ("endless_sse", False, "max_event_bytes (1048576 bytes)"),
                ("endless_sse", True, "max_event_bytes (1048576 bytes)"),
            ]:
                status, body = post(url, _ask(f"solo-{mode}", stream))
                assert status == 502, (mode, body[:300])
                error = json.loads(body)["error"]
                assert error["code"] == "upstream_bad_response"
                assert limit in error["message"], error
            # With somewhere else to go, the client never notices, and the deployment's
            # health is told.
            status, body = post(url, _ask("pair"))
            assert status == 200, body[:300]
        finally:
            sampler.stop()
            thread.join(5)
        assert upstream.answered >= 5
        failovers = _metric(port, 'ballast_failovers_total{deployment="huge-first"')
        assert "bad_response" in failovers, failovers
        after = _settle(pid, port)
        # Each answer was cut at its limit (4 MB), not read whole (200 MB and more).
        assert sampler.peak - baseline < 20 * MB, (baseline, sampler.peak)
        assert after - baseline < 20 * MB, (baseline, after)
        assert sampler.slowest < 1.0  # the worker kept answering while it happened


def _metric(port: int, prefix: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(
    ("mode", "code"), [("cut", "upstream_reset"), ("junk", "upstream_bad_response")]
)
def test_failed_answers_free_what_they_read(
    stack: Stack, tmp_path: Path, mode: str, code: str
) -> None:
    """An attempt that read 48 MB and then broke (or found no JSON in it) leaves nothing
    behind, with the collector
    as tuned for serving (young collections 10,000 objects apart, start-up frozen): no
    exception context or traceback keeps the aborted read alive."""
    upstream = hostile_upstream(stack)
    sim = stack.sim("ok?tokens=5")
    cut = {"id": "cut", "url": upstream.url(mode), "api_key": "sk-h", "probe": "none"}
    settings = config(
        ordered("solo-cut", cut),
        ordered("ok", deployment("ok", sim, "m")),
        timeouts={"first_token": 10.0, "answer": 10.0, "inter_chunk": 10.0},
        routing={"max_attempts": 1},
        upstream={"max_response_bytes": 64 * MB},
    )
    with gateway_process(tmp_path, settings) as (pid, port):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        baseline = _settle(pid, port)
        for _ in range(5):
            status, body = post(url, _ask("solo-cut"))
            assert status == 502, body[:300]
            assert json.loads(body)["error"]["code"] == code
        assert upstream.answered == 5
        after = _settle(pid, port, rounds=5)
        assert after - baseline < 20 * MB, (baseline // MB, after // MB)


@pytest.mark.parametrize(
    "headers",
    [
        b"x-big: " + b"a" * 100_000 + b"\r\n",  # one 100 KB header
        b"".join(b"x-h%05d: v\r\n" % i for i in range(10_000)),  # 10,000 small ones
    ],
    ids=["one-huge", "many-small"],
)
def test_a_header_block_past_max_header_bytes_is_431_even_when_it_arrives_whole(
    stack: Stack, headers: bytes
) -> None:
    sim = stack.sim("ok")
    gw = stack.gateway(config(ordered("chat", deployment("a", sim, "m"))))  # 64 KiB
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + headers
    answer = _raw_request(gw.port, head + b"content-type: application/json\r\n", b"{}")
    assert answer.split(b" ", 2)[1] == b"431", answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "headers_too_large"
    assert stack.attempts(sim) == []
    # A large block under the limit is served.
    fine = b"".join(b"x-h%05d: v\r\n" % i for i in range(4_000))  # about 52 KB
    body = json.dumps({"model": "chat", "messages": MESSAGES}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + fine
    answer = _raw_request(gw.port, head + b"content-type: application/json\r\n", body)
    assert answer.split(b" ", 2)[1] == b"200", answer[:200]

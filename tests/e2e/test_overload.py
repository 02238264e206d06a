"""Overload and slow clients: past `server.max_in_flight` the excess is shed at once with 503
and Retry-After while the rest is served at normal latency; clients trickling headers or a
body are cut off (408/431) without pinning anything; a slow stream reader gets back-pressure
all the way to the upstream instead of unbounded buffering."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp

from tests.stack import Stack, deployment, group, wait_for

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
LATENCY = 0.4  # the upstream's answer time


def _gateway(stack: Stack, behaviour: str, **server: Any) -> Any:
    sim = stack.sim(behaviour)
    gw = stack.gateway(
        {"server": server, "models": [group("chat", deployment("a", sim, model="sim-chat"))]}
    )
    return sim, gw


async def _timed_post(
    session: aiohttp.ClientSession, url: str, body: Any
) -> tuple[int, float, dict[str, Any], dict[str, str]]:
    started = time.perf_counter()
    async with session.post(url, json=body) as response:
        payload = await response.json(content_type=None)
        return response.status, time.perf_counter() - started, payload, dict(response.headers)


def test_load_at_three_times_capacity_is_shed_fast_and_the_rest_served_normally(
    stack: Stack,
) -> None:
    capacity = 4
    _, gw = _gateway(stack, f"ok?tokens=4&latency={LATENCY}", max_in_flight=capacity)
    url = gw.url + "/v1/chat/completions"
    # Capacity: 4 in flight / 0.4 s = 10 requests a second. Offer 30 a second for 3 s.
    rate, seconds = 3 * capacity / LATENCY, 3.0

    Result = tuple[int, float, dict[str, Any], dict[str, str]]

    async def offered() -> tuple[list[Result], list[Result]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks = []
            start = time.perf_counter()
            for i in range(int(rate * seconds)):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                tasks.append(asyncio.create_task(_timed_post(session, url, CHAT)))
            results = await asyncio.gather(*tasks)
            # Load drops: the very next requests are all served.
            after = await asyncio.gather(
                *(_timed_post(session, url, CHAT) for _ in range(capacity))
            )
            return list(results), list(after)

    during, after = asyncio.run(offered())
    ok = [r for r in during if r[0] == 200]
    shed = [r for r in during if r[0] == 503]
    assert len(ok) + len(shed) == len(during)  # nothing else: no 500, no timeout
    # Roughly capacity * duration served; the other two thirds shed.
    assert len(ok) >= 0.6 * capacity / LATENCY * seconds
    assert len(shed) >= len(during) / 2
    shed_ms = sorted(r[1] * 1000 for r in shed)
    assert shed_ms[len(shed_ms) // 2] < 10  # median; each is a counter check
    assert shed_ms[-1] < 50  # the worst includes the test client's own scheduling
    for _, _, payload, headers in shed:
        assert headers["Retry-After"] == "1"
        assert payload["error"]["code"] == "overloaded"
        assert payload["error"]["type"] == "api_error"
    ok_latency = sorted(r[1] for r in ok)
    assert ok_latency[-1] < LATENCY + 0.3  # normal latency: nothing queued behind others
    assert [status for status, *_ in after] == [200] * capacity
    # A request leaves the count just after its last byte, on the gateway's own thread.
    wait_for(lambda: gw.app.in_flight == 0, timeout=2.0)
    assert gw.app.shed == len(shed)


def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = bytearray()  # appended in place: a long answer read in small chunks stays linear
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def test_a_trickled_body_gets_408_and_pins_nothing(stack: Stack) -> None:
    _, gw = _gateway(stack, "ok?tokens=2", body_timeout=1.0, max_in_flight=4)
    socks = []
    started = time.monotonic()
    for _ in range(4):  # as many as max_in_flight: they would block everyone if they pinned
        sock = _raw(gw.port)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: 200\r\n\r\n{"
        )
        socks.append(sock)
    for _ in range(3):
        time.sleep(0.2)
        for sock in socks:
            sock.sendall(b" ")
    answers = [_read_all(sock) for sock in socks]
    elapsed = time.monotonic() - started
    for data in answers:
        assert _status_of(data) == 408
        assert b'"code":"request_timeout"' in data
    assert elapsed < 3.0
    for sock in socks:
        sock.close()
    wait_for(lambda: gw.app.in_flight == 0, timeout=2.0)
    status, _, _, _ = asyncio.run(_one(gw.url))
    assert status == 200


async def _one(url: str) -> tuple[int, float, dict[str, Any], dict[str, str]]:
    async with aiohttp.ClientSession() as session:
        return await _timed_post(session, url + "/v1/chat/completions", CHAT)


def test_trickled_headers_get_408_and_huge_headers_431(stack: Stack) -> None:
    _, gw = _gateway(stack, "ok?tokens=2", header_timeout=0.8, max_header_bytes=8192)
    slow = _raw(gw.port)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    started = time.monotonic()
    try:
        for i in range(20):
            time.sleep(0.1)
            slow.sendall(b"x-slow-%d: 1\r\n" % i)
    except OSError:
        pass  # cut off
    data = _read_all(slow)
    assert _status_of(data) == 408
    assert time.monotonic() - started < 2.5
    slow.close()

    big = _raw(gw.port)
    try:
        big.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 20000)
    except OSError:
        pass
    data = _read_all(big)
    assert _status_of(data) == 431
    big.close()
    # An idle connection that never sends a byte is closed after header_timeout too.
    idle = _raw(gw.port)
    assert _status_of(_read_all(idle)) == 408
    idle.close()
    # Ordinary requests are unaffected.
    assert asyncio.run(_one(gw.url))[0] == 200


def test_each_request_on_a_kept_alive_connection_gets_its_own_header_time(stack: Stack) -> None:
    _, gw = _gateway(stack, "ok?tokens=2", header_timeout=1.0)
    sock = _raw(gw.port)
    body = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    first = b""
    while b"\r\n\r\n" not in first or len(first.split(b"\r\n\r\n", 1)[1]) < int(
        first.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
    ):
        first += sock.recv(65536)  # the whole first answer, headers and body
    assert _status_of(first) == 200
    time.sleep(0.6)  # the connection's timer, armed at connect, is now due in 0.4 s
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and then nothing
    started = time.monotonic()
    data = _read_all(sock)
    waited = time.monotonic() - started
    assert _status_of(data) == 408
    assert 0.9 <= waited < 2.0  # its own full second, not what was left of the first's
    sock.close()


def test_a_slow_stream_reader_gets_back_pressure_not_buffering(stack: Stack) -> None:
    tokens = 150_000  # ~31 MB of events: more than the kernel's socket buffers hold
    sim, gw = _gateway(stack, f"ok?tokens={tokens}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", gw.port))
    body = b'{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def buffered() -> int:
        """The most any client connection of the gateway holds in user space, unsent."""
        return max(
            (c.transport.get_write_buffer_size() for c in gw.server.server_state.connections),
            default=0,
        )

    time.sleep(2.0)  # the client reads nothing; unthrottled, the whole answer takes ~2 s
    sent_before = stack.attempts(sim)[-1]["tokens"]
    held = stack.thread.run(buffered())
    time.sleep(1.0)
    sent_after = stack.attempts(sim)[-1]["tokens"]
    assert sent_after == sent_before < tokens  # the upstream waits for the client's pace
    assert held < 1024 * 1024  # ... and the gateway is not holding the rest in memory
    data = _read_all(sock)
    sock.close()
    assert data.count(b"tok") == tokens  # nothing is lost once it reads
    assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the last chunk, intact

"""A request leaves no reference cycles behind: everything it made is freed by reference
counting when it ends. With the collector as a server tunes it (gc_tuning.py: rare young
collections, start-up frozen), cyclic garbage piles up between collections, and each one
walks it all while every request of the worker waits; under load that was a pause of
hundreds of milliseconds every few seconds. Whole answers, slow ones (the disconnect
watch's task starts), streams, another API's shape, a failover, and a client that leaves
mid-stream, keys with limits and a budget, the response cache, refusals and every provider
adapter are each checked with the collector off and then asked what it would have had to
find."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

# _aws_credentials: the conformance suite's autouse fixture (Bedrock signs with them)
from tests.e2e.test_provider_conformance import PROVIDERS, _aws_credentials  # noqa: F401
from tests.e2e.test_routing import MESSAGES, config, ordered
from tests.stack import Stack, deployment, sqlite_state, wait_for

MASTER = "sk-master-for-garbage-tests-0123"
MINE = ("ballast.", "uvicorn.")
# Ports of servers a test runs beside the gateway with uvicorn too (an MCP tool server built
# with its SDK): their request cycles are theirs, not the gateway's.
FOREIGN_PORTS: set[int] = set()


def _made_here(obj: object) -> str | None:
    """The name of a gateway-side object (the simulators are Ballast's too, but not the
    gateway: they are left out), else None."""
    kind = type(obj)
    code = getattr(obj, "cr_code", None) or getattr(obj, "f_code", None)
    if code is None and hasattr(obj, "get_coro"):
        code = getattr(obj.get_coro(), "cr_code", None)  # a task: what it ran
    if code is not None:
        path = code.co_filename.replace("\\", "/")
        if ("/ballast/" in path and "/ballast/sim/" not in path) or "/uvicorn/" in path:
            return f"{kind.__name__} of {code.co_qualname}"
        return None
    module = kind.__module__ or ""
    scope = getattr(obj, "scope", None)
    if isinstance(scope, dict) and (scope.get("server") or ("", 0))[1] in FOREIGN_PORTS:
        return None
    if module.startswith(MINE) and not module.startswith("ballast.sim"):
        return f"{module}.{kind.__qualname__}"
    return None


@contextmanager
def collector_off() -> Iterator[Counter[str]]:
    """Runs its block with the collector off; then fills the counter with what the
    collector finds of the gateway's (made in the block: all garbage before it is gone)."""
    found: Counter[str] = Counter()
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.update(name for name in map(_made_here, gc.garbage) if name is not None)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    answer = client.post(path, json=body, headers={"authorization": "Bearer sk-anything"})
    assert answer.status_code == 200, answer.text
    return answer


def test_answers_and_streams_leave_no_cycles(stack: Stack) -> None:
    quick = stack.sim("ok?tokens=3", name="quick")
    slow = stack.sim("ok?tokens=3&latency=0.12", name="slow")
    broken = stack.sim("500", name="broken")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("quick", quick, "m")),
            ordered("slow", deployment("slow", slow, "m")),
            ordered("failover", deployment("broken", broken, "m"), deployment("ok", quick, "m")),
        )
    )
    chat = {"model": "chat", "messages": MESSAGES}
    messages = {"model": "chat", "max_tokens": 16, "messages": MESSAGES}
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        _post(client, "/v1/chat/completions", chat)  # first-use caches, outside the count
        with collector_off() as cycles:
            for _ in range(20):
                _post(client, "/v1/chat/completions", chat)
                _post(client, "/v1/chat/completions", {**chat, "stream": True})
            for _ in range(3):
                _post(client, "/v1/chat/completions", {**chat, "model": "slow"})
                _post(client, "/v1/chat/completions", {**chat, "model": "failover"})
                _post(client, "/v1/messages", messages)
                _post(client, "/v1/messages", {**messages, "stream": True})
                _post(client, "/v1/responses", {"model": "chat", "input": "hi", "stream": True})
    assert not cycles, "\n".join(f"{n} {name}" for name, n in cycles.most_common())


def test_a_client_that_leaves_mid_stream_leaves_no_cycles(stack: Stack) -> None:
    sim = stack.sim("ok?tokens=200&delay=0.02")
    gateway = stack.gateway(config(ordered("chat", deployment("a", sim, "m"))))
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    with collector_off() as cycles:
        for _ in range(3):
            with (
                httpx.Client(base_url=gateway.url, timeout=10) as client,
                client.stream("POST", "/v1/chat/completions", json=body) as answer,
            ):
                next(answer.iter_bytes())
        wait_for(lambda: gateway.app.in_flight == 0)
        time.sleep(0.2)  # the cut requests' last callbacks run
    assert not cycles, "\n".join(f"{n} {name}" for name, n in cycles.most_common())


def test_keys_limits_cache_continuation_and_errors_leave_no_cycles(
    stack: Stack, tmp_path: Path
) -> None:
    sim = stack.sim("ok?tokens=3")
    cut = stack.sim("cut?after=2&tokens=6", name="cut")
    gateway = stack.gateway(
        config(
            ordered("chat", deployment("a", sim, "sim-chat")),
            ordered("cached", deployment("b", sim, "sim-chat"), cache={"ttl": 60}),
            ordered("cut", deployment("cut", cut, "sim-chat"), deployment("ok", sim, "sim-chat")),
            server={"master_key": MASTER},
            state=sqlite_state(tmp_path),
            prices={"sim-chat": {"input": 1.0, "output": 1.0}},
        )
    )
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        made = client.post(
            "/admin/keys",
            json={"name": "t", "rpm": 1000, "max_parallel": 8, "budget": 100.0},
            headers={"authorization": f"Bearer {MASTER}"},
        )
        assert made.status_code == 201, made.text
        key = {"authorization": f"Bearer {made.json()['key']}"}
        chat = {"model": "chat", "messages": MESSAGES}
        client.post("/v1/chat/completions", json=chat, headers=key)  # first use, uncounted
        with collector_off() as cycles:
            for model in ("chat", "cached", "cut"):
                for stream in (False, True, False, True):
                    body = {**chat, "model": model, "stream": stream}
                    answer = client.post("/v1/chat/completions", json=body, headers=key)
                    assert answer.status_code == 200, answer.text
            refused = [
                client.post("/v1/chat/completions", json=chat),  # no key
                client.post("/v1/chat/completions", json={**chat, "model": "nope"}, headers=key),
                client.post("/v1/chat/completions", content=b"{not json", headers=key),
                client.post("/v1/messages", json={"model": "chat"}, headers=key),
            ]
            assert [r.status_code for r in refused] == [401, 404, 400, 400]
    assert not cycles, "\n".join(f"{n} {name}" for name, n in cycles.most_common())


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_every_provider_adapter_leaves_no_cycles(stack: Stack, provider: str) -> None:
    sim = stack.sim("ok?tokens=3")
    gateway = stack.gateway(config(ordered("chat", PROVIDERS[provider]("a", sim.url))))
    chat = {"model": "chat", "messages": MESSAGES}
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        _post(client, "/v1/chat/completions", chat)  # first use, uncounted
        with collector_off() as cycles:
            for _ in range(5):
                _post(client, "/v1/chat/completions", chat)
                _post(client, "/v1/chat/completions", {**chat, "stream": True})
    assert not cycles, "\n".join(f"{n} {name}" for name, n in cycles.most_common())


def test_mcp_requests_leave_no_cycles(stack: Stack) -> None:
    from tests.mcp_server import ToolServer
    from tests.stack import free_port, group

    def echo(text: str) -> str:
        """Say it back."""
        return text

    tools = stack.thread.run(ToolServer("alpha", echo).start())
    FOREIGN_PORTS.add(tools.port)
    down = f"http://127.0.0.1:{free_port()}/mcp"
    servers = [
        {"name": "alpha", "url": tools.url, "revision": "2025-11-25"},
        {"name": "gone", "url": down, "revision": "2025-11-25", "list_retries": 0},
    ]
    gateway = stack.gateway(
        {"models": [group("m", deployment("d", stack.sim()))], "mcp": {"servers": servers}}
    )
    accept = "application/json, text/event-stream"

    def rpc(client: httpx.Client, method: str, session: str = "", **params: Any) -> Any:
        headers = {"accept": accept, **({"mcp-session-id": session} if session else {})}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return client.post("/mcp", json=body, headers=headers)

    def session_of_calls(client: httpx.Client) -> None:
        hello = rpc(client, "initialize", protocolVersion="2025-11-25", capabilities={})
        session = hello.headers["mcp-session-id"]
        assert "alpha__echo" in rpc(client, "tools/list", session).text
        called = rpc(client, "tools/call", session, name="alpha__echo", arguments={"text": "x"})
        assert called.json()["result"]["isError"] is False
        assert rpc(client, "tools/call", session, name="gone__x").json()["result"]["isError"]
        assert "error" in rpc(client, "tools/call", session, name="nope__x").json()
        stack.thread.run(tools.restart())  # the next call heals
        healed = rpc(client, "tools/call", session, name="alpha__echo", arguments={"text": "y"})
        assert healed.json()["result"]["isError"] is False
        client.delete("/mcp", headers={"mcp-session-id": session})

    try:
        with httpx.Client(base_url=gateway.url, timeout=20) as client:
            session_of_calls(client)  # warm: pools, what the server speaks, first heal
            with collector_off() as found:
                for _ in range(3):
                    session_of_calls(client)
    finally:
        stack.thread.run(tools.close())
        FOREIGN_PORTS.discard(tools.port)
    assert found == Counter(), found

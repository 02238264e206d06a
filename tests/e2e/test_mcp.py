"""`/mcp` end to end: the official MCP SDK as the client, tool servers built with the same
SDK behind Ballast (tests/mcp_server.py), real loopback ports. Tools from two servers are
listed as one, calls are routed by prefix, a server restart between two calls is healed
without the client noticing, and a server down or silent costs the client a bounded error
and never the other server's tools."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ballast.sim.server import SimServer
from tests.faultproxy import FaultProxy
from tests.mcp_server import ToolServer
from tests.stack import Gateway, Stack, deployment, free_port, group, sqlite_state, wait_for

T = TypeVar("T")
SECRET = "upstream-secret-for-alpha"


def echo(text: str) -> str:
    """Say the text back."""
    return text


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def shout(text: str) -> str:
    """Say the text back in capitals."""
    return text.upper()


@pytest.fixture
def alpha(stack: Stack) -> Iterator[ToolServer]:
    server = stack.thread.run(ToolServer("alpha", echo, add).start())
    yield server
    stack.thread.run(server.close())


@pytest.fixture
def beta(stack: Stack) -> Iterator[ToolServer]:
    server = stack.thread.run(ToolServer("beta", shout, json_response=True).start())
    yield server
    stack.thread.run(server.close())


def _state() -> dict[str, Any]:
    """A database file of the gateway's own (keys created and looked up from several tasks
    are not for one shared in-memory connection)."""
    return sqlite_state(Path(tempfile.mkdtemp(prefix="mcp-", dir=Path.cwd())))


def server(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": url, "revision": "2025-11-25", **extra}


def gateway(stack: Stack, sim: SimServer, *servers: dict[str, Any], **mcp: Any) -> Gateway:
    return stack.gateway(
        {
            "state": _state(),
            "models": [group("m", deployment("d1", sim))],
            "mcp": {"servers": list(servers), **mcp},
        }
    )


def run(
    stack: Stack,
    gw: Gateway,
    body: Callable[[Client], Awaitable[T]],
    key: str | None = None,
    mode: str = "legacy",
) -> T:
    """`body` with an SDK client connected to the gateway's /mcp."""

    async def connected() -> T:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with httpx2.AsyncClient(headers=headers, timeout=20) as http:
            transport = streamable_http_client(gw.url + "/mcp", http_client=http)
            async with Client(transport, mode=mode) as client:
                return await body(client)

    return stack.thread.run(connected())


async def tool_names(client: Client) -> list[str]:
    return sorted(tool.name for tool in (await client.list_tools()).tools)


def text_of(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


def test_tools_of_two_servers_are_listed_as_one_and_calls_are_routed(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url), server("beta", beta.url))

    async def body(client: Client) -> tuple[list[str], str, str, bool]:
        names = await tool_names(client)
        summed = await client.call_tool("alpha__add", {"a": 2, "b": 3})
        shouted = await client.call_tool("beta__shout", {"text": "hi"})
        return names, text_of(summed), text_of(shouted), bool(shouted.is_error)

    names, summed, shouted, failed = run(stack, gw, body)
    assert names == ["alpha__add", "alpha__echo", "beta__shout"]
    assert (summed, shouted, failed) == ("5", "HI", False)


def test_a_server_restart_between_two_calls_is_healed_without_the_client_noticing(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))

    async def body(client: Client) -> list[str]:
        first = await client.call_tool("alpha__echo", {"text": "one"})
        await alpha.restart()  # every session id it gave out now answers 404
        second = await client.call_tool("alpha__echo", {"text": "two"})
        names = await tool_names(client)
        assert not first.is_error and not second.is_error
        return [text_of(first), text_of(second), *names]

    assert run(stack, gw, body) == ["one", "two", "alpha__add", "alpha__echo"]
    upstream = gw.app.mcp.upstreams["alpha"]
    assert upstream.heals == 1
    assert alpha.initializes == 2  # the session, and the one that replaced it


def test_concurrent_calls_meeting_one_lost_session_share_one_initialize(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))

    async def body(client: Client) -> list[str]:
        await client.call_tool("alpha__echo", {"text": "warm"})
        await alpha.restart()
        calls = [client.call_tool("alpha__echo", {"text": f"c{i}"}) for i in range(8)]
        return [text_of(result) for result in await asyncio.gather(*calls)]

    assert run(stack, gw, body) == [f"c{i}" for i in range(8)]
    assert alpha.initializes == 2  # eight requests met the 404; one initialize healed them


def test_a_server_down_hides_only_its_own_tools_and_a_call_to_it_is_a_tool_error(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    down = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    gw = gateway(stack, sim, server("alpha", alpha.url), server("beta", down))

    async def body(client: Client) -> tuple[list[str], Any]:
        return await tool_names(client), await client.call_tool("beta__shout", {"text": "x"})

    names, result = run(stack, gw, body)
    assert names == ["alpha__add", "alpha__echo"]
    assert result.is_error and "beta" in text_of(result)


def test_a_blackholed_server_is_a_bounded_error_and_hides_nothing_else(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    proxy = FaultProxy("127.0.0.1", alpha.port)
    port = stack.thread.run(proxy.start())
    via_proxy = f"http://127.0.0.1:{port}/mcp"
    fast = {"call_timeout": 0.5, "list_timeout": 0.5, "list_retries": 0}
    gw = gateway(stack, sim, server("alpha", via_proxy, **fast), server("beta", beta.url))

    async def body(client: Client) -> tuple[list[str], Any, float, list[str]]:
        before = await tool_names(client)
        proxy.blackhole()
        started = time.monotonic()
        result = await client.call_tool("alpha__echo", {"text": "lost"})
        took = time.monotonic() - started
        return before, result, took, await tool_names(client)

    try:
        before, result, took, after = run(stack, gw, body)
    finally:
        stack.thread.run(proxy.close())
    assert before == ["alpha__add", "alpha__echo", "beta__shout"]
    assert result.is_error and "did not answer in 0.5s" in text_of(result)
    assert took < 5.0
    assert after == ["beta__shout"]


def test_a_keys_allowlist_holds_on_list_and_call_and_its_token_never_reaches_a_server(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    credential = {"authorization": f"Bearer {SECRET}"}
    gw = gateway(
        stack, sim, server("alpha", alpha.url, headers=credential), server("beta", beta.url)
    )
    key, record = stack.thread.run(gw.app.state.keys.create("agent", mcp=["alpha/echo", "beta"]))

    async def body(client: Client) -> tuple[list[str], str, str]:
        names = await tool_names(client)
        echoed = await client.call_tool("alpha__echo", {"text": "ok"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("alpha__add", {"a": 1, "b": 2})
        return names, text_of(echoed), str(refused.value)

    names, echoed, refused = run(stack, gw, body, key=key)
    assert names == ["alpha__echo", "beta__shout"]
    assert echoed == "ok"
    assert "alpha__add" in refused
    assert alpha.received and all(h["authorization"] == f"Bearer {SECRET}" for h in alpha.received)
    assert not any(key in str(headers) for headers in alpha.received + beta.received)
    metrics = gw.app.observer.metrics.render().decode()
    counted = 'ballast_mcp_tool_calls_total{key="%s",outcome="ok",server="alpha",tool="echo"} 1.0'
    assert counted % record.id in metrics


def test_a_keys_rate_limit_applies_to_tool_calls(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))
    key, _ = stack.thread.run(gw.app.state.keys.create("slow", rpm=1))

    async def body(client: Client) -> str:
        await client.call_tool("alpha__echo", {"text": "one"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("alpha__echo", {"text": "two"})
        return str(refused.value)

    assert "Rate limit reached for requests" in run(stack, gw, body, key=key)


def test_a_client_without_a_valid_key_is_refused(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))
    stack.thread.run(gw.app.state.keys.create("someone"))

    async def body(client: Client) -> list[str]:
        return await tool_names(client)

    with pytest.raises(ExceptionGroup) as refused:  # the handshake was refused
        run(stack, gw, body, key="sk-bl-not-a-key")
    assert refused.group_contains(MCPError, match="Incorrect API key provided", depth=2)
    assert alpha.received == []


def test_the_stateless_revision_both_ways(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    # alpha: found out by asking (it speaks 2026-07-28); beta: held to the handshake.
    gw = gateway(stack, sim, server("alpha", alpha.url, revision="auto"), server("beta", beta.url))

    async def body(client: Client) -> tuple[str, list[str], str, str]:
        names = await tool_names(client)
        echoed = await client.call_tool("alpha__echo", {"text": "now"})
        shouted = await client.call_tool("beta__shout", {"text": "now"})
        return client.protocol_version, names, text_of(echoed), text_of(shouted)

    version, names, echoed, shouted = run(stack, gw, body, mode="auto")
    assert version == "2026-07-28"
    assert names == ["alpha__add", "alpha__echo", "beta__shout"]
    assert (echoed, shouted) == ("now", "NOW")
    assert gw.app.mcp.upstreams["alpha"].modern is True
    calls = [h for h in alpha.received if h.get("mcp-method") == "tools/call"]
    assert [h["mcp-name"] for h in calls] == ["echo"]  # the prefix is not the server's
    assert "mcp-session-id" not in str(alpha.received)
    assert beta.initializes == 1


def test_a_404_to_a_request_without_a_session_id_is_no_session_loss(
    stack: Stack, sim: SimServer
) -> None:
    plain = stack.thread.run(ToolServer("plain", echo, stateless=True).start())
    try:
        gw = gateway(stack, sim, server("plain", plain.url))

        async def body(client: Client) -> str:
            await client.call_tool("plain__echo", {"text": "one"})
            plain.status = 404  # no session id was sent: this 404 is the server's answer
            with pytest.raises(MCPError) as failed:
                await client.call_tool("plain__echo", {"text": "two"})
            return str(failed.value)

        assert "HTTP 404" in run(stack, gw, body)
        assert gw.app.mcp.upstreams["plain"].heals == 0
        assert plain.initializes == 1
    finally:
        stack.thread.run(plain.close())


def test_a_failing_server_opens_its_breaker_and_then_costs_no_connection(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    breaker = {"failure_threshold": 2, "open_time": 60}
    gw = gateway(stack, sim, server("alpha", alpha.url, breaker=breaker))

    async def body(client: Client) -> tuple[list[str], int]:
        await client.call_tool("alpha__echo", {"text": "up"})
        alpha.status = 503
        before = len(alpha.received)
        results = [await client.call_tool("alpha__echo", {"text": "x"}) for _ in range(3)]
        assert all(result.is_error for result in results)
        return [text_of(result) for result in results], len(alpha.received) - before

    texts, reached = run(stack, gw, body)
    assert "alpha: server_error" in texts[0]
    assert "is failing; retry in" in texts[2]
    assert reached == 2  # the third call never left Ballast


def test_with_on_server_down_error_a_down_servers_tools_stay_and_fail_fast(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    gw = gateway(
        stack, sim, server("alpha", alpha.url), server("beta", beta.url), on_server_down="error"
    )

    async def body(client: Client) -> tuple[list[str], list[str], Any]:
        before = await tool_names(client)
        beta.status = 503
        after = await tool_names(client)
        return before, after, await client.call_tool("beta__shout", {"text": "x"})

    before, after, result = run(stack, gw, body)
    assert before == after == ["alpha__add", "alpha__echo", "beta__shout"]
    assert result.is_error and "beta" in text_of(result)


def test_a_client_session_ended_ends_its_session_on_the_server(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))

    async def body(client: Client) -> str:
        return text_of(await client.call_tool("alpha__echo", {"text": "bye"}))

    assert run(stack, gw, body) == "bye"  # the SDK client DELETEs its session on exit
    wait_for(lambda: any(h[":method"] == "DELETE" for h in alpha.received))
    assert len(gw.app.mcp.sessions) == 0


def test_stateless_clients_share_one_server_session_and_its_one_heal(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url))  # alpha held to the handshake

    async def warm(client: Client) -> str:
        return text_of(await client.call_tool("alpha__echo", {"text": "warm"}))

    async def fleet(client: Client) -> list[str]:
        await alpha.restart()
        calls = [client.call_tool("alpha__echo", {"text": f"c{i}"}) for i in range(8)]
        return [text_of(result) for result in await asyncio.gather(*calls)]

    assert run(stack, gw, warm, mode="auto") == "warm"
    assert run(stack, gw, warm, mode="auto") == "warm"  # another client, the same session
    assert alpha.initializes == 1
    assert run(stack, gw, fleet, mode="auto") == [f"c{i}" for i in range(8)]
    assert alpha.initializes == 2


def test_prompts_and_resources_are_merged_routed_and_held_to_the_allowlist(
    stack: Stack, sim: SimServer, alpha: ToolServer, beta: ToolServer
) -> None:
    gw = gateway(stack, sim, server("alpha", alpha.url), server("beta", beta.url))

    async def everything(client: Client) -> tuple[list[str], list[str], str, str]:
        prompts = sorted(p.name for p in (await client.list_prompts()).prompts)
        resources = sorted(str(r.uri) for r in (await client.list_resources()).resources)
        greeting = await client.get_prompt("beta__greet", {"who": "you"})
        read = await client.read_resource("note://alpha")
        said = "".join(getattr(m.content, "text", "") for m in greeting.messages)
        return prompts, resources, said, getattr(read.contents[0], "text", "")

    prompts, resources, said, note = run(stack, gw, everything)
    assert prompts == ["alpha__greet", "beta__greet"]
    assert resources == ["note://alpha", "note://beta"]
    assert (said, note) == ("beta greets you", "a note from alpha")
    key, _ = stack.thread.run(gw.app.state.keys.create("agent", mcp=["alpha/echo", "beta"]))

    async def limited(client: Client) -> tuple[list[str], list[str], str]:
        prompts = sorted(p.name for p in (await client.list_prompts()).prompts)
        resources = sorted(str(r.uri) for r in (await client.list_resources()).resources)
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("alpha__greet", {"who": "me"})
        return prompts, resources, str(refused.value)

    prompts, resources, refused = run(stack, gw, limited, key=key)
    assert prompts == ["beta__greet"] and resources == ["note://beta"]
    assert "alpha__greet" in refused


def test_an_answer_past_the_bound_is_a_tool_error_not_a_gateway_out_of_memory(
    stack: Stack, sim: SimServer
) -> None:
    def big(size: int) -> str:
        """A long text."""
        return "x" * size

    huge = stack.thread.run(ToolServer("huge", big).start())
    try:
        gw = gateway(stack, sim, server("huge", huge.url), max_answer_bytes=65536)

        async def body(client: Client) -> tuple[Any, Any]:
            small = await client.call_tool("huge__big", {"size": 1000})
            return small, await client.call_tool("huge__big", {"size": 300_000})

        small, large = run(stack, gw, body)
    finally:
        stack.thread.run(huge.close())
    assert not small.is_error and len(text_of(small)) == 1000
    assert large.is_error and "bad_response" in text_of(large)


def test_call_metrics_label_only_listed_tools_and_keys_as_the_requests_do(
    stack: Stack, sim: SimServer, alpha: ToolServer
) -> None:
    gw = stack.gateway(
        {
            "state": _state(),
            "observe": {"per_key_metrics": False},
            "models": [group("m", deployment("d1", sim))],
            "mcp": {"servers": [server("alpha", alpha.url)]},
        }
    )

    async def body(client: Client) -> None:
        await tool_names(client)
        await client.call_tool("alpha__echo", {"text": "x"})
        try:
            await client.call_tool("alpha__made_up_by_a_client", {})
        except MCPError:
            pass  # refused one way or another: only its label matters here

    run(stack, gw, body)
    metrics = gw.app.observer.metrics.render().decode()
    assert 'key="all",outcome="ok",server="alpha",tool="echo"} 1.0' in metrics
    assert 'server="alpha",tool="other"} 1.0' in metrics
    assert "made_up" not in metrics

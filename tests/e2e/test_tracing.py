"""OpenTelemetry spans: one per request and one per upstream attempt, only when configured."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.stack import Stack, deployment, group

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def spans() -> Iterator[object]:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter


def test_spans_per_request_and_per_attempt(stack: Stack, spans: object) -> None:
    failing, healthy = stack.sim("500"), stack.sim("ok")
    gw = stack.gateway(
        {
            "observe": {"tracing": True},
            "models": [
                group("m", deployment("a", failing), deployment("b", healthy), strategy="ordered")
            ],
        }
    )
    spans.clear()  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-client", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES)
    deadline = time.monotonic() + 5
    while True:  # the request span ends just after the client has its answer
        finished = spans.get_finished_spans()  # type: ignore[attr-defined]
        requests = [s for s in finished if s.name == "ballast.request"]
        if requests or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    attempts = [s for s in finished if s.name == "ballast.attempt"]
    assert len(requests) == 1
    assert [s.attributes["ballast.deployment"] for s in attempts] == ["a", "b"]
    assert attempts[0].status.status_code == trace.StatusCode.ERROR
    assert attempts[0].attributes["ballast.outcome"] == "server_error"
    assert attempts[1].status.status_code != trace.StatusCode.ERROR
    assert all(
        s.parent is not None and s.parent.span_id == requests[0].context.span_id for s in attempts
    )


def test_no_spans_unless_configured(stack: Stack, spans: object) -> None:
    gw = stack.gateway({"models": [group("m", deployment("a", stack.sim()))]})
    spans.clear()  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-client", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES)
    assert spans.get_finished_spans() == ()  # type: ignore[attr-defined]


def test_a_span_per_mcp_tool_call(stack: Stack, spans: object) -> None:
    from mcp import Client

    from tests.mcp_server import ToolServer

    def echo(text: str) -> str:
        """Say it back."""
        return text

    tools = stack.thread.run(ToolServer("alpha", echo).start())
    gw = stack.gateway(
        {
            "observe": {"tracing": True},
            "models": [group("m", deployment("a", stack.sim("ok")))],
            "mcp": {"servers": [{"name": "alpha", "url": tools.url, "revision": "2025-11-25"}]},
        }
    )
    spans.clear()  # type: ignore[attr-defined]

    async def call() -> None:
        async with Client(gw.url + "/mcp", mode="legacy") as client:
            await client.call_tool("alpha__echo", {"text": "hi"})

    try:
        stack.thread.run(call())
    finally:
        stack.thread.run(tools.close())
    finished = spans.get_finished_spans()  # type: ignore[attr-defined]
    calls = [s for s in finished if s.name == "ballast.mcp.tool_call"]
    assert len(calls) == 1
    assert calls[0].attributes["ballast.server"] == "alpha"
    assert calls[0].attributes["ballast.tool"] == "echo"
    assert calls[0].attributes["ballast.outcome"] == "ok"

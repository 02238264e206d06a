"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright with
the system browser): it renders every deployment, shows a breaker opening when a simulated
upstream starts failing, lists the breaker transition among recent events, and logs no
console error. Skipped only when no chromium is installed."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.stack import Stack, deployment, group

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MASTER = "bk-master-dashboard-0123"
TOKEN = "dash-token-dashboard-4567"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"
)


def test_dashboard_shows_a_breaker_opening_without_console_errors(
    stack: Stack, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    a = stack.sim("ok?tokens=8", name="a")
    b = stack.sim("ok?tokens=8", name="b")
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": TOKEN},
            "timeouts": {"connect": 1.0, "first_token": 0.5, "inter_chunk": 0.5, "answer": 1.0},
            "routing": {"breaker": {"failure_threshold": 2, "open_time": 30.0}},
            "models": [
                group("chat", deployment("a", a), deployment("b", b), strategy="ordered"),
                group("embed", deployment("e1", b)),
            ],
        }
    )
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER, max_retries=0, timeout=10)
    for _ in range(3):
        api.chat.completions.create(model="chat", messages=MESSAGES)

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(f"{gateway.url}/dashboard?token={TOKEN}")
            page.wait_for_selector('[data-deployment="a"] [data-breaker="closed"]', timeout=10_000)
            page.wait_for_selector('[data-deployment="b"] [data-breaker="closed"]', timeout=5_000)
            page.wait_for_selector('[data-model="embed"] [data-deployment="e1"]', timeout=5_000)
            assert page.inner_text("#conn") == "live"
            assert page.inner_text("#jobs") == "no jobs backend configured"

            stack.set_behaviour(a, "500")
            load = threading.Thread(
                target=lambda: [
                    api.chat.completions.create(model="chat", messages=MESSAGES) for _ in range(4)
                ]
            )
            load.start()
            load.join(20)
            page.wait_for_selector('[data-deployment="a"] [data-breaker="open"]', timeout=10_000)
            page.wait_for_selector('#events [data-event="breaker"]', timeout=5_000)
            page.wait_for_selector('#events [data-event="failover"]', timeout=5_000)
            assert "a: closed → open" in page.inner_text("#events")
            assert page.get_attribute('[data-deployment="b"] [data-breaker]', "data-breaker") == (
                "closed"
            )
            # b has served every request of the last minute since a failed.
            assert page.inner_text('[data-deployment="b"] [data-share]') != "-"
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            target = os.environ.get("BALLAST_DASHBOARD_SCREENSHOT")
            if target:
                page.screenshot(path=target, full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_dashboard_shows_spend_per_key_and_model_and_failures_with_their_cause(
    stack: Stack, tmp_path: Path
) -> None:
    import json
    import urllib.request

    from playwright.sync_api import sync_playwright

    good = stack.sim("ok?tokens=12", name="good")
    bad = stack.sim("500", name="bad")
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": TOKEN},
            "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
            "routing": {"max_attempts": 2},
            "prices": {"gpt-small": {"input": 150.0, "output": 600.0}},
            "models": [
                group("chat", deployment("primary", good, model="gpt-small")),
                group("broken", deployment("down", bad)),
            ],
        }
    )
    request = urllib.request.Request(
        gateway.url + "/admin/keys",
        data=json.dumps({"name": "finance-team", "budget": 5.0}).encode(),
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        created = json.loads(response.read())
    api = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=created["key"], max_retries=0, timeout=10
    )
    cost = 0.0
    for _ in range(3):
        reply = api.chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.usage is not None
        cost += (reply.usage.prompt_tokens * 150.0 + reply.usage.completion_tokens * 600.0) / 1e6
    with pytest.raises(openai.APIStatusError):
        api.chat.completions.create(model="broken", messages=MESSAGES)

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(f"{gateway.url}/dashboard?token={TOKEN}")
            key_cost = f'[data-usage-key="{created["id"]}"] [data-cost]'
            page.wait_for_selector(key_cost, timeout=10_000)
            assert float(page.get_attribute(key_cost, "data-cost") or "nan") == cost
            model_cost = page.get_attribute('[data-usage-model="chat"] [data-cost]', "data-cost")
            assert float(model_cost or "nan") == cost
            page.wait_for_selector('#failures [data-failure="server_error"]', timeout=5_000)
            assert "broken via down: 502" in page.inner_text("#failures")
            assert page.inner_text("#spent").startswith("$")
            row = page.inner_text(f'[data-usage-key="{created["id"]}"]')
            assert "$" in row and "3" in row
            target = os.environ.get("BALLAST_DASHBOARD_SCREENSHOT")
            page.screenshot(path=target or str(tmp_path / "spend.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []


def test_dashboard_shows_each_mcp_server_its_breaker_and_its_heals(stack: Stack) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from playwright.sync_api import sync_playwright

    from tests.mcp_server import ToolServer

    def echo(text: str) -> str:
        """Say it back."""
        return text

    tools = stack.thread.run(ToolServer("alpha", echo).start())
    server = {"name": "alpha", "url": tools.url, "revision": "2025-11-25"}
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": TOKEN},
            "models": [group("chat", deployment("a", stack.sim("ok")))],
            "mcp": {"servers": [server]},
        }
    )

    async def across_a_restart() -> None:
        headers = {"authorization": f"Bearer {MASTER}"}
        async with httpx2.AsyncClient(headers=headers, timeout=20) as http:
            transport = streamable_http_client(gateway.url + "/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                await client.call_tool("alpha__echo", {"text": "one"})
                await tools.restart()
                await client.call_tool("alpha__echo", {"text": "two"})

    problems: list[str] = []
    try:
        stack.thread.run(across_a_restart())
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.on(
                    "console",
                    lambda m: problems.append(m.text) if m.type == "error" else None,
                )
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.goto(f"{gateway.url}/dashboard?token={TOKEN}")
                row = '[data-mcp-server="alpha"]'
                page.wait_for_selector(f'{row} [data-breaker="closed"]', timeout=10_000)
                page.wait_for_selector(f'{row} [data-heals="1"]', timeout=5_000)
                page.wait_for_selector('#events [data-event="heal"]', timeout=5_000)
                assert "mcp:alpha: lost a session" in page.inner_text("#events")
            finally:
                browser.close()
    finally:
        stack.thread.run(tools.close())
    assert problems == []

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

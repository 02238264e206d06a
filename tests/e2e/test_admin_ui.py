"""The admin UI in a real headless Chromium (the system's, driven by Playwright, as the
dashboard's test does): an operator signs in with the master key, makes a team and a key
(its value shown once), a client uses the key through the OpenAI SDK against the simulator,
its request and its spend appear (by key, team and model), the key is edited, rotated and
revoked, and the SDK is then refused with 401. The dashboard token reads but cannot change
anything; a hostile key name stays text; the page is never framed; no console error (a
policy violation is one). With BALLAST_ADMIN_SCREENSHOTS=<dir>, a screenshot of each page
is saved there as admin-<page>.png (docs/img holds the ones in the docs)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_dashboard import ARGS, CHROMIUM
from tests.stack import Gateway, Stack, deployment, group, sqlite_state, wait_for

MASTER = "bk-master-admin-ui-0123"
TOKEN = "dash-token-admin-ui-4567"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
PRICE_IN, PRICE_OUT = 150.0, 600.0  # dollars per million tokens
HOSTILE = '<img src=x onerror="window.pwned=1">'

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"
)


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim("ok?tokens=12", name="sim")
    other = stack.sim("ok?tokens=3", name="other")
    return stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": TOKEN},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"gpt-small": {"input": PRICE_IN, "output": PRICE_OUT}},
            "models": [
                group("chat", deployment("primary", sim, model="gpt-small")),
                group("spare", deployment("spare-1", other), deployment("spare-2", other)),
            ],
        }
    )


def _use(gw: Gateway, key: str, times: int) -> float:
    """`times` answers through the SDK with `key`; what they cost."""
    cost = 0.0
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=10) as api:
        for _ in range(times):
            reply = api.chat.completions.create(model="chat", messages=MESSAGES)
            assert reply.usage is not None
            usage = reply.usage
            cost += (usage.prompt_tokens * PRICE_IN + usage.completion_tokens * PRICE_OUT) / 1e6
    return cost


def _create_key(gw: Gateway, name: str) -> None:
    request = urllib.request.Request(
        gw.url + "/admin/keys",
        data=json.dumps({"name": name}).encode(),
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def _shoot(page: Any, tmp_path: Path, name: str) -> None:
    folder = os.environ.get("BALLAST_ADMIN_SCREENSHOTS")
    target = Path(folder) if folder else tmp_path
    page.screenshot(path=str(target / f"admin-{name}.png"), full_page=True)


def _flushed(gw: Gateway, key_id: str, cost: float) -> bool:
    """Whether the key's spend records reached the database (the spend page reads them)."""
    request = urllib.request.Request(
        gw.url + "/admin/spend?by=key", headers={"authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        series = json.loads(response.read())["data"]
    return any(s["id"] == key_id and abs(s["cost"] - cost) < 1e-12 for s in series)


def _spend_shows(page: Any, by: str, series: str, cost: float) -> None:
    """The spend page, by `by`, shows `series` at `cost`."""
    page.select_option("#spend-form select[name=by]", by)
    page.click("#spend-form button[type=submit]")
    cell = page.wait_for_selector(f'#spend [data-series="{series}"] [data-cost]')
    assert abs(float(cell.get_attribute("data-cost")) - cost) < 1e-12
    assert "$" in cell.inner_text()


def test_an_operator_manages_a_key_from_creation_to_revocation(
    gateway: Gateway, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}")
                    if m.type == "error" and "401" not in m.text
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("dialog", lambda dialog: dialog.accept())

            response = page.goto(gateway.url + "/ui")
            assert response is not None and response.status == 200
            assert response.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
            _shoot(page, tmp_path, "signin")
            page.fill("#credential", "not-the-key")
            page.click("#signin-form button")
            page.wait_for_selector("#signin-error:not([hidden])")
            page.fill("#credential", MASTER)
            page.click("#signin-form button")
            page.wait_for_selector("#who:not([hidden])")
            assert page.inner_text("#who") == "master key"
            # Kept in this tab's storage, never in a cookie.
            assert page.context.cookies() == []
            assert page.evaluate("sessionStorage.length") == 1

            # A team, then a key in it: its value is shown once.
            page.click('nav a[data-page="teams"]')
            page.click("#new-team")
            page.fill("#team-form input[name=name]", "research")
            page.fill("#team-form input[name=budget]", "100")
            page.click("#team-form button[type=submit]")
            team_row = page.wait_for_selector("#teams tbody tr")
            assert team_row is not None
            team_id = team_row.get_attribute("data-team")
            assert team_id and "research" in team_row.inner_text()

            page.click('nav a[data-page="keys"]')
            page.click("#new-key")
            page.fill("#key-form input[name=name]", "ui-key")
            page.select_option("#key-form select[name=team_id]", team_id)
            page.fill("#key-form input[name=rpm]", "100")
            page.fill("#key-form input[name=budget]", "50")
            page.click("#key-form button[type=submit]")
            page.wait_for_selector("#secret:not([hidden])")
            secret = page.inner_text("#secret-value")
            assert secret.startswith("sk-")
            key_row = page.wait_for_selector("#keys tbody tr")
            assert key_row is not None
            key_id = key_row.get_attribute("data-key")
            assert key_id and "research" in key_row.inner_text()
            _shoot(page, tmp_path, "keys")
            page.click("#secret-done")
            assert page.inner_text("#secret-value") == ""

            # A client uses it; its requests and its spend appear.
            cost = _use(gateway, secret, 3)
            page.click('nav a[data-page="requests"]')
            mine = f'#requests tr[data-key-id="{key_id}"]'
            # A request is noted as it ends, just after its answer: the page polls.
            page.wait_for_selector(f"#requests tbody tr:nth-child(3)[data-key-id='{key_id}']")
            rows = page.query_selector_all(mine)
            assert len(rows) == 3
            text = rows[0].inner_text()
            assert "ui-key" in text and "/v1/chat/completions" in text and "primary" in text
            assert "200" in text and "$" in text
            _shoot(page, tmp_path, "requests")

            wait_for(lambda: _flushed(gateway, key_id, cost))
            page.click('nav a[data-page="spend"]')
            _spend_shows(page, "team", team_id, cost)
            _spend_shows(page, "model", "gpt-small", cost)
            _spend_shows(page, "key", key_id, cost)
            assert page.query_selector("#chart svg polyline") is not None
            assert "ui-key" in page.inner_text(f'#spend [data-series="{key_id}"]')
            _shoot(page, tmp_path, "spend")

            # Edit its limits, rotate it (the new value works), revoke it (the SDK gets 401).
            page.click('nav a[data-page="keys"]')
            page.click(f'#keys tr[data-key="{key_id}"] [data-action="edit"]')
            page.fill("#key-form input[name=rpm]", "7")
            page.fill("#key-form input[name=models]", "chat, spare")
            page.click("#key-form button[type=submit]")
            page.wait_for_selector(f'#keys tr[data-key="{key_id}"]:has-text("chat, spare")')
            assert "7" in page.inner_text(f'#keys tr[data-key="{key_id}"]')
            page.click(f'#keys tr[data-key="{key_id}"] [data-action="rotate"]')
            page.fill("#rotate-form input[name=grace_seconds]", "60")
            page.click("#rotate-form button[type=submit]")
            page.wait_for_selector("#secret:not([hidden])")
            rotated = page.inner_text("#secret-value")
            assert rotated.startswith("sk-") and rotated != secret
            page.click("#secret-done")
            _use(gateway, rotated, 1)
            _use(gateway, secret, 1)  # the old value, within its grace
            page.click(f'#keys tr[data-key="{key_id}"] [data-action="revoke"]')
            page.wait_for_selector(f'#keys tr[data-key="{key_id}"] .pill.revoked')
            for value in (secret, rotated):
                with pytest.raises(openai.AuthenticationError) as refused:
                    _use(gateway, value, 1)
                assert refused.value.status_code == 401

            page.click('nav a[data-page="models"]')
            dep = page.wait_for_selector('[data-model="chat"] [data-deployment="primary"]')
            assert dep is not None
            assert "gpt-small\t150\t600\tclosed" in dep.inner_text()
            assert page.get_attribute('[data-deployment="primary"] [data-breaker]', "data-breaker")
            assert page.query_selector('[data-model="spare"] [data-deployment="spare-2"]')
            _shoot(page, tmp_path, "models")

            page.click('nav a[data-page="audit"]')
            page.wait_for_selector('#audit tr[data-audit="key.revoke"]')
            rows = page.query_selector_all("#audit tbody tr")
            actions = [r.get_attribute("data-audit") for r in rows]
            assert actions[:5] == [
                "key.revoke",
                "key.rotate",
                "key.update",
                "key.create",
                "team.create",
            ]
            # An edit sends (and the log keeps) only what changed.
            detail = page.inner_text('#audit tr[data-audit="key.update"] td:last-child')
            assert json.loads(detail) == {"models": ["chat", "spare"], "rpm": 7}
            audit_text = page.inner_text("#audit")
            assert "master_key" in audit_text and secret not in audit_text
            _shoot(page, tmp_path, "audit")

            # The read-only token: everything shows, nothing can be changed.
            page.click("#signout")
            assert page.evaluate("sessionStorage.length") == 0
            assert page.query_selector_all("main tbody tr") == []  # nothing read stays
            _create_key(gateway, HOSTILE)
            page.fill("#credential", TOKEN)
            page.click("#signin-form button")
            page.wait_for_selector("#who:not([hidden])")
            page.click('nav a[data-page="keys"]')
            page.wait_for_selector("#keys tbody tr")
            assert "read-only" in page.inner_text("#who")
            assert not page.is_visible("#new-key")
            assert not page.is_visible(f'#keys tr[data-key="{key_id}"] [data-action="revoke"]')
            names = [c.inner_text() for c in page.query_selector_all("#keys [data-name]")]
            assert HOSTILE in names  # shown as the text it is
            assert page.evaluate("window.pwned") is None
            assert page.query_selector("#keys img") is None
            page.click('nav a[data-page="teams"]')
            page.wait_for_selector(f'#teams tr[data-team="{team_id}"]')
            _shoot(page, tmp_path, "teams")
        finally:
            browser.close()
    assert problems == []

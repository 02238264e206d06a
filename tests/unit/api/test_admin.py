"""What the admin API accepts: the master key in a header only for writing, JSON bodies only,
a lock-out after wrong keys (on the app's clock), and pages no other site may frame. The app
is driven through its ASGI callable (tests/unit/drive.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ballast.app import BallastApp
from ballast.resilience.clock import ManualClock
from tests.unit.drive import Client, settings_tree, started

MASTER = "sk-master-admin-0123456789"
DASHBOARD = "dash-token-admin-0123"
JSON = (b"content-type", b"application/json")
AUTH = (b"authorization", f"Bearer {MASTER}".encode())
LIMIT, LOCKOUT = 3, 30.0


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[BallastApp, ManualClock]]:
    tree = settings_tree(
        tmp_path,
        "http://127.0.0.1:9/v1",
        master_key=MASTER,
        dashboard_token=DASHBOARD,
        admin_failure_limit=LIMIT,
        admin_lockout=LOCKOUT,
    )
    clock = ManualClock()
    app = await started(tree, clock)
    try:
        yield app, clock
    finally:
        await app.shutdown()


async def _call(
    app: BallastApp,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
    query: bytes = b"",
) -> Client:
    client = Client(app, method, path, [body], headers=headers, query=query)
    await client.done()
    return client


async def _keys(app: BallastApp) -> int:
    return await app.state.keys.count()


async def test_writing_takes_the_master_key_in_a_header_only(
    clocked: tuple[BallastApp, ManualClock],
) -> None:
    app, _ = clocked
    query = f"token={MASTER}".encode()
    created = await _call(app, "POST", "/admin/keys", [JSON], b'{"name":"a"}', query)
    assert created.status == 401 and await _keys(app) == 0
    reload = await _call(app, "POST", "/admin/reload", [JSON], query=query)
    assert reload.status == 401
    listed = await _call(app, "GET", "/admin/keys", [], query=f"token={DASHBOARD}".encode())
    assert listed.status == 200  # reading keys (never their values) is the dashboard's too
    read = await _call(app, "GET", "/admin/state", [], query=f"token={DASHBOARD}".encode())
    assert read.status == 200  # reading may still name a token in the query (the dashboard)
    created = await _call(app, "POST", "/admin/keys", [JSON, AUTH], b'{"name":"a"}')
    assert created.status == 201 and await _keys(app) == 1


@pytest.mark.parametrize(
    "kind",
    [b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x", b"text/plain"],
)
async def test_writing_takes_json_only(
    clocked: tuple[BallastApp, ManualClock], kind: bytes
) -> None:
    app, _ = clocked
    form = await _call(app, "POST", "/admin/keys", [(b"content-type", kind), AUTH], b"name=a")
    assert form.status == 415 and await _keys(app) == 0
    drain = await _call(app, "POST", "/admin/deployments/a/drain", [(b"content-type", kind), AUTH])
    assert drain.status == 415 and not app.router.targets["a"].drained


async def test_wrong_admin_keys_lock_the_address_out_for_a_while(
    clocked: tuple[BallastApp, ManualClock],
) -> None:
    app, clock = clocked
    wrong = [JSON, (b"authorization", b"Bearer sk-master-admin-guess-000")]
    for _ in range(LIMIT):
        assert (await _call(app, "GET", "/admin/state", wrong)).status == 401
    locked = await _call(app, "GET", "/admin/state", [JSON, AUTH])  # even the right key
    assert locked.status == 429
    assert dict(locked.sent[0]["headers"])[b"retry-after"] == str(int(LOCKOUT)).encode()
    assert locked.json()["error"]["code"] == "admin_locked_out"
    dashboard = await _call(app, "GET", "/dashboard", [], query=f"token={DASHBOARD}".encode())
    assert dashboard.status == 429
    clock.advance(LOCKOUT - 1)
    assert (await _call(app, "GET", "/admin/state", [JSON, AUTH])).status == 429
    clock.advance(1)
    assert (await _call(app, "GET", "/admin/state", [JSON, AUTH])).status == 200
    # A success clears the count: fewer than the limit again is no lock-out.
    for _ in range(LIMIT - 1):
        assert (await _call(app, "GET", "/admin/state", wrong)).status == 401
    assert (await _call(app, "GET", "/admin/state", [JSON, AUTH])).status == 200
    assert (await _call(app, "GET", "/admin/state", wrong)).status == 401
    assert (await _call(app, "GET", "/admin/state", [JSON, AUTH])).status == 200


async def test_admin_answers_and_the_dashboard_refuse_to_be_framed(
    clocked: tuple[BallastApp, ManualClock],
) -> None:
    app, _ = clocked
    for client in (
        await _call(app, "GET", "/admin/state", [AUTH]),
        await _call(app, "GET", "/admin/state", []),  # a refusal too
        await _call(app, "GET", "/dashboard", [], query=f"token={DASHBOARD}".encode()),
        await _call(app, "GET", "/dashboard", []),
    ):
        headers = dict(client.sent[0]["headers"])
        assert headers[b"x-frame-options"] == b"DENY"
        assert headers[b"content-security-policy"] == b"frame-ancestors 'none'"

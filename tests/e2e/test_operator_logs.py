"""Logs an operator can use: every request line names the key's team; a refused request
(429 for a limit, 429 for a budget, 403 for a model) names its key and the error code; the
path is the one the client called; and every admin change is in an audit log kept in the
database (who, what, when, never a secret), readable with the dashboard token."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ballast.observe.logs import JsonFormatter
from tests.e2e.test_access import MASTER, admin, client, new_key
from tests.e2e.test_observe import call
from tests.stack import Gateway, Stack, deployment, group, sqlite_state, wait_for

DASHBOARD = "dash-token-operator-logs-42"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gateway(stack: Stack, tmp_path: Path) -> Gateway:
    sim = stack.sim("ok?tokens=5")
    return stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": DASHBOARD},
            "state": sqlite_state(tmp_path, spend_flush_interval=0.1),
            "prices": {"sim-chat": {"input": 0.0, "output": 1_000_000.0}},  # $1 an output token
            "models": [
                group("chat", deployment("a", sim, model="sim-chat")),
                group("other", deployment("b", sim, model="sim-chat")),
            ],
        }
    )


def lines(caplog: pytest.LogCaptureFixture, count: int) -> list[dict[str, Any]]:
    """The request lines, once there are `count`: a line is written as its request ends,
    which may be just after the client has its answer."""

    def written() -> list[dict[str, Any]]:
        return [
            json.loads(JsonFormatter().format(r))
            for r in caplog.records
            if r.name == "ballast.access"
        ]

    wait_for(lambda: len(written()) >= count)
    return written()


def ask(gw: Gateway, key: str, model: str = "chat") -> None:
    with client(gw, key) as api:
        api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)


def test_each_request_line_names_the_team_of_its_key(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    status, team = admin(gateway, "POST", "/admin/teams", {"name": "research"})
    assert status == 201
    in_team, in_team_id = new_key(gateway, team_id=team["id"])
    alone, alone_id = new_key(gateway)
    ask(gateway, in_team)
    ask(gateway, alone)
    by_key = {line["key_id"]: line for line in lines(caplog, 2)}
    assert by_key[in_team_id]["team"] == team["id"]
    assert by_key[alone_id]["team"] is None


def test_a_refused_request_names_its_key_and_the_error_code(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    limited, limited_id = new_key(gateway, rpm=1)
    ask(gateway, limited)
    with pytest.raises(openai.RateLimitError):
        ask(gateway, limited)
    broke, broke_id = new_key(gateway, budget=1.0, budget_period="total")
    with pytest.raises(openai.RateLimitError):
        ask(gateway, broke)  # five output tokens may cost $5: more than is left
    narrow, narrow_id = new_key(gateway, models=["other"])
    with pytest.raises(openai.PermissionDeniedError):
        ask(gateway, narrow)

    written = lines(caplog, 4)
    refused = {line["key_id"]: line for line in written if line["status"] >= 400}
    assert (refused[limited_id]["status"], refused[limited_id]["error_code"]) == (
        429,
        "rate_limit_exceeded",
    )
    assert (refused[broke_id]["status"], refused[broke_id]["error_code"]) == (
        429,
        "insufficient_quota",
    )
    assert (refused[narrow_id]["status"], refused[narrow_id]["error_code"]) == (
        403,
        "model_not_allowed",
    )
    assert all(line["team"] is None for line in refused.values())
    served = [line for line in written if line["status"] == 200]
    assert served and all("error_code" not in line for line in served)


def test_the_line_has_the_path_the_client_called(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.access")
    key, key_id = new_key(gateway)
    ask(gateway, key)
    with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0) as claude:
        claude.messages.create(model="chat", max_tokens=5, messages=MESSAGES)
    paths = [line["path"] for line in lines(caplog, 2) if line.get("key_id") == key_id]
    assert paths == ["/v1/chat/completions", "/v1/messages"]


def test_admin_changes_are_audited_in_the_database_without_secrets(
    gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ballast.events")
    status, team = admin(gateway, "POST", "/admin/teams", {"name": "ops", "rpm": 10})
    assert status == 201
    status, made = admin(gateway, "POST", "/admin/keys", {"name": "ci", "team_id": team["id"]})
    assert status == 201
    secret = made["key"]
    admin(gateway, "POST", "/admin/keys/update", {"id": made["id"], "rpm": 5})
    status, rotated = admin(
        gateway, "POST", "/admin/keys/rotate", {"id": made["id"], "grace_seconds": 60}
    )
    assert status == 200
    admin(gateway, "POST", "/admin/keys/revoke", {"id": made["id"]})
    admin(gateway, "POST", "/admin/teams/update", {"id": team["id"], "budget": 3.0})
    admin(gateway, "POST", "/admin/deployments/b/drain")
    # Refused changes are not actions: nothing of them is in the log.
    assert admin(gateway, "POST", "/admin/keys/update", {"id": "key_none", "rpm": 1})[0] == 404

    status, body = call("GET", gateway.url + "/admin/audit", token=DASHBOARD)
    assert status == 200
    entries = body["data"]
    assert [(e["action"], e["target"]) for e in reversed(entries)] == [
        ("team.create", team["id"]),
        ("key.create", made["id"]),
        ("key.update", made["id"]),
        ("key.rotate", made["id"]),
        ("key.revoke", made["id"]),
        ("team.update", team["id"]),
        ("deployment.drain", "b"),
    ]
    assert {e["actor"] for e in entries} == {"master_key"}
    assert entries[-1]["detail"] == {"name": "ops", "rpm": 10}
    assert entries[-2]["detail"]["team_id"] == team["id"]
    assert entries[-3]["detail"] == {"rpm": 5}
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs, reverse=True)
    older = call("GET", gateway.url + f"/admin/audit?before={seqs[2]}&limit=2", token=DASHBOARD)
    assert [e["seq"] for e in older[1]["data"]] == seqs[3:5]
    # In the database itself, and with no secret anywhere: not the key, not the master key.
    with sqlite3.connect(tmp_path / "ballast.db") as db:
        rows = db.execute("SELECT actor, action, target, detail FROM admin_audit").fetchall()
    assert len(rows) == 7
    written = json.dumps(rows) + json.dumps(entries)
    events = [JsonFormatter().format(r) for r in caplog.records if r.name == "ballast.events"]
    assert sum('"event": "admin"' in e or '"event":"admin"' in e for e in events) == 7
    for text in (written, *events):
        for value in (secret, rotated["key"], MASTER, DASHBOARD):
            assert value not in text


def test_writes_take_the_master_key_from_the_header_only(gateway: Gateway) -> None:
    url = gateway.url
    assert call("POST", url + f"/admin/keys?token={MASTER}", body={"name": "x"})[0] == 401
    assert call("POST", url + "/admin/keys", token=DASHBOARD, body={"name": "x"})[0] == 401
    assert call("GET", url + "/admin/audit", token=DASHBOARD)[1]["data"] == []
    # Reads take either credential; the query string still serves the dashboard's link.
    assert call("GET", url + f"/admin/keys?token={DASHBOARD}")[0] == 200
    status, who = call("GET", url + "/admin/whoami", token=DASHBOARD)
    assert (status, who) == (200, {"actor": "dashboard_token", "can_write": False})
    status, who = call("GET", url + "/admin/whoami", token=MASTER)
    assert (status, who) == (200, {"actor": "master_key", "can_write": True})

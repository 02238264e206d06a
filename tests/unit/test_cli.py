"""`ballast --version`; `ballast keys` and `ballast teams`: create, update, rotate and
list, against a real (SQLite) database, as an operator would run them."""

from __future__ import annotations

import importlib.metadata
import re
import sqlite3
from pathlib import Path

import yaml
from typer.testing import CliRunner

from ballast.cli import cli


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_keys_and_teams_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "ballast.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state": {
                    "database_url": f"sqlite:///{tmp_path / 'b.db'}",
                    "spend_journal": str(tmp_path / "spend.journal"),
                },
                "models": [{"name": "chat", "deployments": [{"id": "a", "url": "http://x"}]}],
            }
        )
    )
    conf = str(config)
    team = _run("teams", "create", "-c", conf, "--name", "research", "--budget", "50")
    team_id = team.split("id: ")[1].strip()
    made = _run("keys", "create", "-c", conf, "--name", "alice", "--rpm", "10", "--team", team_id)
    key_id = re.search(r"id:\s+(\S+)", made).group(1)  # type: ignore[union-attr]
    first = re.search(r"key:\s+(\S+)", made).group(1)  # type: ignore[union-attr]
    _run("keys", "update", "-c", conf, key_id, "--tpm", "1000", "--clear", "rpm")
    listed = _run("keys", "list", "-c", conf)
    assert f"team={team_id}" in listed and "tpm=1000" in listed and "rpm=" not in listed
    assert "spend(" in listed and first not in listed
    rotated = _run("keys", "rotate", "-c", conf, key_id, "--grace-seconds", "60")
    assert re.search(r"key:\s+(\S+)", rotated).group(1) != first  # type: ignore[union-attr]
    teams = _run("teams", "list", "-c", conf)
    assert "research" in teams and key_id in teams
    bad = CliRunner().invoke(cli, ["keys", "update", "-c", conf, key_id, "--rpm", str(2**31)])
    assert bad.exit_code == 2 and "rpm" in bad.output
    _run("keys", "revoke", "-c", conf, key_id)
    # Each change is in the audit log the admin API writes, with no key's value.
    with sqlite3.connect(tmp_path / "b.db") as db:
        audit = db.execute("SELECT actor, action, target, detail FROM admin_audit").fetchall()
    assert [(actor, action, target) for actor, action, target, _ in audit] == [
        ("cli", "team.create", team_id),
        ("cli", "key.create", key_id),
        ("cli", "key.update", key_id),
        ("cli", "key.rotate", key_id),
        ("cli", "key.revoke", key_id),
    ]
    assert audit[2][3] == '{"tpm":1000,"rpm":null}'
    assert first not in repr(audit) and rotated.split()[3] not in repr(audit)


def test_a_key_for_a_model_the_config_does_not_serve_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "ballast.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state": {
                    "database_url": f"sqlite:///{tmp_path / 'b.db'}",
                    "spend_journal": str(tmp_path / "spend.journal"),
                },
                "models": [{"name": "chat", "deployments": [{"id": "a", "url": "http://x"}]}],
            }
        )
    )
    conf = str(config)
    refused = CliRunner().invoke(
        cli, ["keys", "create", "-c", conf, "--name", "a", "--models", "nope"]
    )
    assert refused.exit_code == 2
    assert "'models' names a model the config does not serve: 'nope'." in refused.output
    assert "key:" not in refused.output
    made = _run("keys", "create", "-c", conf, "--name", "a", "--models", "chat")
    key_id = re.search(r"id:\s+(\S+)", made).group(1)  # type: ignore[union-attr]
    changed = CliRunner().invoke(cli, ["keys", "update", "-c", conf, key_id, "--models", "chat,x"])
    assert changed.exit_code == 2 and "'x'" in changed.output
    both = CliRunner().invoke(
        cli, ["keys", "create", "-c", conf, "--name", "b", "--rpm", "0", "--budget", "-1"]
    )
    assert both.exit_code == 2 and "'rpm'" in both.output and "'budget'" in both.output
    assert "nope" not in _run("keys", "list", "-c", conf)


def test_version_is_the_installed_package_version() -> None:
    assert _run("--version") == f"ballast {importlib.metadata.version('ballast')}\n"


def test_check_config_refuses_a_short_master_key(tmp_path: Path) -> None:
    config = tmp_path / "ballast.yaml"
    tree = {
        "server": {"master_key": "x" * 15},
        "models": [{"name": "chat", "deployments": [{"id": "a", "url": "http://x"}]}],
    }
    config.write_text(yaml.safe_dump(tree))
    result = CliRunner().invoke(cli, ["check-config", str(config)])
    assert result.exit_code != 0
    assert "server.master_key" in result.output and "16 characters" in result.output
    assert "x" * 15 not in result.output
    tree["server"] = {"master_key": "x" * 16}
    config.write_text(yaml.safe_dump(tree))
    _run("check-config", str(config))
    tree["server"] = {"master_key": ""}  # `${VAR:-}` with VAR unset: no master key
    config.write_text(yaml.safe_dump(tree))
    _run("check-config", str(config))


def test_a_keys_mcp_allowlist_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "ballast.yaml"
    state = {"database_url": f"sqlite:///{tmp_path / 'b.db'}"}
    models = [{"name": "chat", "deployments": [{"id": "a", "url": "http://x"}]}]
    config.write_text(yaml.safe_dump({"state": state, "models": models}))
    conf = str(config)
    made = _run("keys", "create", "-c", conf, "--name", "agent", "--mcp", "alpha/echo, beta")
    key_id = re.search(r"id:\s+(\S+)", made).group(1)  # type: ignore[union-attr]
    with sqlite3.connect(tmp_path / "b.db") as db:
        stored = db.execute("SELECT mcp FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    assert stored == ('["alpha/echo","beta"]',)
    _run("keys", "update", "-c", conf, key_id, "--mcp", "gamma")
    with sqlite3.connect(tmp_path / "b.db") as db:
        stored = db.execute("SELECT mcp FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    assert stored == ('["gamma"]',)

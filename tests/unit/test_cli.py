"""`ballast keys` and `ballast teams`: create, update, rotate and list, against a real
(SQLite) database, as an operator would run them."""

from __future__ import annotations

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

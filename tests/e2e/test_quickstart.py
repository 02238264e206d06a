"""The README's quickstart as written: its config (with the upstream's URL pointed at the
simulator), its `keys create` command and its first request through the official OpenAI
SDK, against a real gateway on loopback. A new user's first five minutes must work."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from ballast.cli import cli
from ballast.config import load_settings
from tests.docs import ROOT, marked
from tests.stack import Stack

README = ROOT / "README.md"
UPSTREAM = "https://api.openai.com/v1"  # the quickstart's upstream, where the simulator stands
GATEWAY = "http://127.0.0.1:8080"  # where the quickstart's gateway serves
ANSWER = "".join(f"tok{i} " for i in range(16))  # the simulator's usual answer


def _create_key() -> str:
    """Step 4: the README's `ballast keys create` line, run as written; the key it prints."""
    lines = marked(README, "quickstart: key").text.splitlines()
    args = shlex.split(next(line for line in lines if " keys create " in line), comments=True)
    assert args[0] == ".venv/bin/ballast"
    result = CliRunner().invoke(cli, args[1:])
    assert result.exit_code == 0, result.output
    found = re.search(r"^key: (\S+)$", result.output, re.MULTILINE)
    assert found is not None, result.output
    return found.group(1)


def test_the_readme_quickstart_works_as_written(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = stack.sim()
    config = marked(README, "quickstart: config").text
    assert config.count(UPSTREAM) == 1
    assert len(config.splitlines()) <= 10  # the promise: a ten-line config
    Path("ballast.yaml").write_text(config.replace(UPSTREAM, sim.url + "/v1"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-secret")
    monkeypatch.setenv("BALLAST_MASTER_KEY", "a-long-random-master-key-for-the-test")
    gateway = stack.gateway(load_settings("ballast.yaml"))

    monkeypatch.setenv("BALLAST_KEY", _create_key())
    client = marked(README, "quickstart: client").text
    assert client.count(GATEWAY) == 1
    names: dict[str, object] = {}
    exec(compile(client.replace(GATEWAY, gateway.url), "README quickstart", "exec"), names)
    assert capsys.readouterr().out == ANSWER + "\n"
    sdk = names["client"]
    assert isinstance(sdk, openai.OpenAI)
    sdk.close()

    # The gateway is closed to anyone without a key of its own.
    with (
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-guess", max_retries=0) as other,
        pytest.raises(openai.AuthenticationError),
    ):
        other.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )

"""The real coding agents through Ballast: Claude Code (`claude -p`) and Codex CLI
(`codex exec`), at the versions scripts/agent-clis.sh pins, run non-interactively against the
simulator in a streamed tool loop: Claude Code with extended thinking (the strict simulator
refuses a tool turn whose signed thinking block did not come back intact), Codex with
encrypted reasoning and `store: false` (refused without its reasoning item). Each run's first
deployment fails, so the answer comes after a failover, on the native paths and the bridged
ones. The CLIs' own network features (telemetry, update checks) are turned off."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group

ROOT = Path(__file__).resolve().parents[2]
# Claude Code's tool loop: the simulator calls its Read tool on this file, then answers.
NOTES = "notes.txt"


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    """Where the pinned CLIs are: the test script installs them first; a run of pytest on its
    own installs them here the same way (never skipped: agents are what this proves)."""
    given = os.environ.get("BALLAST_AGENT_BIN")
    if given:
        return Path(given)
    done = subprocess.run(
        [str(ROOT / "scripts" / "agent-clis.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return Path(done.stdout.strip().splitlines()[-1])


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **extra}


def claude(agent_bin: Path, gateway: Gateway, home: Path, prompt: str) -> list[dict[str, Any]]:
    """`claude -p`, streamed as JSON lines, thinking on: its events, parsed."""
    env = _env(
        home,
        ANTHROPIC_BASE_URL=gateway.url,
        ANTHROPIC_API_KEY="sk-client",
        ANTHROPIC_SMALL_FAST_MODEL="claude-sim-haiku",
        MAX_THINKING_TOKENS="2048",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    command = [str(agent_bin / "claude"), "-p", prompt, "--model", "claude-sim-agent"]
    command += ["--output-format", "stream-json", "--verbose"]
    done = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def codex(agent_bin: Path, gateway: Gateway, home: Path, prompt: str) -> list[dict[str, Any]]:
    """`codex exec --json` on a provider that is Ballast's Responses API, reasoning on."""
    provider = (
        f'{{name="ballast", base_url="{gateway.url}/v1", wire_api="responses",'
        ' env_key="BALLAST_KEY"}'
    )
    command = [str(agent_bin / "codex"), "exec", "--skip-git-repo-check", "--json"]
    for setting in (
        "model_provider=ballast",
        f"model_providers.ballast={provider}",
        'model_reasoning_effort="low"',
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
    ):
        command += ["-c", setting]
    command += ["-m", "gpt-sim", prompt]
    env = _env(home, CODEX_HOME=str(home), BALLAST_KEY="sk-client")
    done = subprocess.run(
        command,
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _blocks(events: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [
        block
        for event in events
        if event.get("type") == role
        for block in event["message"]["content"]
        if isinstance(block, dict)
    ]


def _served(stack: Stack, sim: SimServer) -> list[dict[str, Any]]:
    return [a for a in stack.attempts(sim) if a["outcome"] == "ok"]


def _down(stack: Stack, **extra: Any) -> dict[str, Any]:
    """A first deployment that fails every request before its first byte."""
    return deployment("down", stack.sim("500", name="down"), **extra)


def _anthropic(dep_id: str, sim: SimServer) -> dict[str, Any]:
    return {**deployment(dep_id, sim, provider="anthropic"), "url": sim.url}


@pytest.mark.parametrize("path", ["native", "bridged"])
def test_claude_code_runs_its_tool_loop_with_thinking(
    stack: Stack, agent_bin: Path, tmp_path: Path, path: str
) -> None:
    (tmp_path / NOTES).write_text("the notes\n")
    if path == "native":
        up = stack.sim(f"ok?shape=agent&tool=Read&arg={tmp_path / NOTES}&tokens=4", name="up")
        served = _anthropic("up", up)
    else:  # an OpenAI-compatible upstream: Messages translated to chat and back
        up = stack.sim("ok?shape=tool&tokens=4", name="up")
        served = deployment("up", up)
    first = _anthropic("down", stack.sim("500", name="down"))  # native, failing: fail over
    gateway = stack.gateway({"models": [group("claude-*", first, served, strategy="ordered")]})
    events = claude(agent_bin, gateway, tmp_path, "Read the notes, then sum them up.")
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result["result"] == "tok0 tok1 tok2 tok3 "
    calls = [b for b in _blocks(events, "assistant") if b["type"] == "tool_use"]
    results = [b for b in _blocks(events, "user") if b["type"] == "tool_result"]
    assert len(calls) == 1 and [r["tool_use_id"] for r in results] == [calls[0]["id"]]
    attempts = _served(stack, up)
    assert len(attempts) >= 2 and all(a["stream"] for a in attempts)
    if path == "native":
        # The file was read, and its signed thinking went back (else the simulator refuses).
        assert calls[0]["name"] == "Read" and "the notes" in str(results[0]["content"])
        thinking = [b for b in _blocks(events, "assistant") if b["type"] == "thinking"]
        assert thinking and all(b["signature"] for b in thinking)
        # What Claude Code sent reached the upstream as it was sent, betas included.
        assert "context_management" in attempts[-1]["fields"]
        assert "thinking" in attempts[-1]["fields"]
        assert "context-management" in attempts[-1]["headers"]["anthropic-beta"]
    else:
        assert calls[0]["name"] == "lookup"  # a tool Claude Code has not: an error result


@pytest.mark.parametrize("path", ["native", "bridged"])
def test_codex_runs_its_tool_loop_with_encrypted_reasoning(
    stack: Stack, agent_bin: Path, tmp_path: Path, path: str
) -> None:
    up = stack.sim("ok?shape=tool&tokens=4", name="up")
    mode = "native" if path == "native" else "bridge"
    served = deployment("up", up, responses=mode)
    first = _down(stack, responses=mode)
    gateway = stack.gateway({"models": [group("gpt-sim", first, served, strategy="ordered")]})
    events = codex(agent_bin, gateway, tmp_path, "Look the word up, then answer.")
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "turn.completed", events
    answers = [
        e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"
    ]
    assert answers == ["tok0 tok1 tok2 tok3 "]
    attempts = _served(stack, up)
    # The tool call, then the answer to its result: two streamed requests, the second
    # carrying the call (and, natively, the encrypted reasoning the simulator insists on).
    assert len(attempts) == 2 and all(a["stream"] for a in attempts)
    wire = "/v1/responses" if path == "native" else "/v1/chat/completions"
    assert [a["path"] for a in attempts] == [wire, wire]

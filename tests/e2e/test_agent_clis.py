"""The real coding agents through Ballast: Claude Code (`claude -p`) and Codex CLI
(`codex exec`), at the versions scripts/agent-clis.sh pins, run non-interactively against the
simulator in a streamed tool loop: Claude Code with extended thinking (the strict simulator
refuses a tool turn whose signed thinking block did not come back intact), Codex with
encrypted reasoning and `store: false` (refused without its reasoning item). Each run's first
deployment fails, so the answer comes after a failover, on the native paths and the bridged
ones (Claude Code's Messages also bridged to chat and back in front of Anthropic, its signed
thinking and cache marks carried through the translation). The CLIs' own network features
(telemetry, update checks) are turned off. And Claude Code as an MCP client of Ballast's
`/mcp`, calling a tool twice in one run across a restart of the tool server behind it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ballast.sim.server import SimServer
from tests.mcp_server import ToolServer
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


def claude(
    agent_bin: Path,
    gateway: Gateway,
    home: Path,
    prompt: str,
    *options: str,
    key: str = "sk-client",
    **settings: str,
) -> list[dict[str, Any]]:
    """`claude -p`, streamed as JSON lines, thinking on, `options` added, `settings` in its
    environment: its events, parsed."""
    env = _env(
        home,
        **settings,
        ANTHROPIC_BASE_URL=gateway.url,
        ANTHROPIC_API_KEY=key,
        ANTHROPIC_SMALL_FAST_MODEL="claude-sim-haiku",
        MAX_THINKING_TOKENS="2048",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    command = [str(agent_bin / "claude"), "-p", prompt, "--model", "claude-sim-agent"]
    command += ["--output-format", "stream-json", "--verbose", *options]
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


@pytest.mark.parametrize("path", ["native", "bridged-anthropic", "bridged"])
def test_claude_code_runs_its_tool_loop_with_thinking(
    stack: Stack, agent_bin: Path, tmp_path: Path, path: str
) -> None:
    (tmp_path / NOTES).write_text("the notes\n")
    if path != "bridged":
        up = stack.sim(f"ok?shape=agent&tool=Read&arg={tmp_path / NOTES}&tokens=4", name="up")
        served = _anthropic("up", up)
        if path == "bridged-anthropic":  # translated to chat and back, thinking carried
            served["messages"] = "bridge"
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
    if path != "bridged":
        # The file was read, and its signed thinking went back (else the simulator refuses).
        assert calls[0]["name"] == "Read" and "the notes" in str(results[0]["content"])
        thinking = [b for b in _blocks(events, "assistant") if b["type"] == "thinking"]
        assert thinking and all(b["signature"] for b in thinking)
        assert "thinking" in attempts[-1]["fields"]
        assert attempts[-1]["cache_marks"]  # Claude Code's prompt-cache marks arrived
    if path == "native":
        # What Claude Code sent reached the upstream as it was sent, betas included.
        assert "context_management" in attempts[-1]["fields"]
        assert "context-management" in attempts[-1]["headers"]["anthropic-beta"]
    elif path == "bridged-anthropic":  # translated: what chat cannot say was left out
        assert "context_management" not in attempts[-1]["fields"]
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


@pytest.fixture
def stamps(stack: Stack) -> Iterator[ToolServer]:
    """An MCP server whose one tool, `stamp`, answers with the number of the session (of
    those it opened) that served the call."""

    def stamp(text: str) -> dict[str, Any]:
        """Say the text back, with the number of the session that served it."""
        return {"text": text, "session": server.initializes}

    server = stack.thread.run(ToolServer("alpha", stamp).start())
    yield server
    stack.thread.run(server.close())


def test_claude_code_calls_mcp_tools_through_ballast_across_a_server_restart(
    stack: Stack, agent_bin: Path, tmp_path: Path, stamps: ToolServer
) -> None:
    stamps.restart_on_call = 2  # it forgets every session right before the second call
    name = "mcp__ballast__alpha__stamp"  # Claude Code's name for Ballast's alpha__stamp
    up = stack.sim(f"ok?shape=agent&tool={name}&arg=hello&calls=2&tokens=4", name="up")
    gateway = stack.gateway(
        {
            # A file: an in-memory database is one connection shared by every task.
            "state": {"database_url": f"sqlite:///{tmp_path / 'state.db'}"},
            "models": [group("claude-*", _anthropic("up", up))],
            "mcp": {"servers": [{"name": "alpha", "url": stamps.url, "revision": "2025-11-25"}]},
        }
    )
    key, _ = stack.thread.run(gateway.app.state.keys.create("agent"))
    ballast = {
        "type": "http",
        "url": gateway.url + "/mcp",
        "headers": {"Authorization": f"Bearer {key}"},
    }
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"ballast": ballast}}))
    options = ["--mcp-config", str(config), "--strict-mcp-config", "--allowedTools", name]
    # Its MCP tools offered as they are, not found by a search first (its default).
    search = {"ENABLE_TOOL_SEARCH": "false"}
    events = claude(agent_bin, gateway, tmp_path, "Stamp it twice.", *options, key=key, **search)
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result["result"] == "tok0 tok1 tok2 tok3 "
    calls = [b for b in _blocks(events, "assistant") if b["type"] == "tool_use"]
    assert [c["name"] for c in calls] == [name, name]
    # Both results reached the model, neither an error: the first from the session the
    # restart ended, the second from the one Ballast opened in its place.
    results = [b for b in _blocks(events, "user") if b["type"] == "tool_result"]
    assert [r.get("is_error", False) for r in results] == [False, False], results
    got = [json.loads(text) for text in _served(stack, up)[-1]["tool_results"]]
    assert got == [{"text": "hello", "session": 1}, {"text": "hello", "session": 2}]
    assert (stamps.initializes, stamps.calls) == (2, 3)  # the second call replayed once
    assert gateway.app.mcp.upstreams["alpha"].heals == 1
    metrics = gateway.app.observer.metrics.render().decode()
    assert 'ballast_heals_total{deployment="mcp:alpha",reason="mcp_session_lost"} 1.0' in metrics

"""The systems under test: direct nginx, the bare floor, Ballast and LiteLLM's proxy."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import nginx
from procs import ProcessGroup, free_port, log_tail, wait_ready

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = BENCH / ".venvs" / "litellm"
ALL_TARGETS = (
    "direct",
    "bare",
    "ballast",
    "ballast+keys",
    "ballast+keys+redis",
    "ballast-2w",
    "ballast-assemble",
    "ballast-messages",
    "ballast-messages-native",
    "ballast-responses",
    "ballast-anthropic",
    "ballast-granian",
    "litellm",
    "portkey",
)
# The keys+limits+spend variants: a virtual key whose limits are far above what the bench
# can send, so every check runs (key lookup, budget, RPM/TPM/parallel, spend) and none refuses.
BENCH_MASTER = "bk-bench-master-key"
KEY_LIMITS = ["--rpm", "100000000", "--tpm", "2000000000", "--max-parallel", "100000"]
KEY_LIMITS += ["--budget", "1000000000", "--budget-period", "total"]


@dataclass
class Target:
    """One system to load: where to send requests and which process tree to account."""

    name: str
    url: str = ""
    stream_url: str = ""
    pid: int = 0
    unavailable: str = ""
    note: str = ""
    key: str = "sk-bench"  # sent as the bearer token
    shape: str = "openai"  # the inbound API its requests speak (load.SHAPES)
    # Headers a target needs on every request (Portkey's name the upstream), and on streams.
    headers: dict[str, str] = field(default_factory=dict)
    stream_headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.unavailable


@dataclass
class Upstream:
    port: int
    pid: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_nginx(procs: ProcessGroup, workdir: Path) -> Upstream:
    prefix = workdir / "nginx"
    prefix.mkdir()
    port = free_port()
    log = workdir / "nginx.log"
    proc = procs.start(nginx.nginx_command(prefix, port), log)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 10, prefix / "error.log")
    return Upstream(port, proc.pid)


def redis_missing() -> str:
    """Why the Redis variant cannot run here, or ``""`` when it can."""
    if not shutil.which("redis-server"):
        return "redis-server is not installed (apt-get install -y redis-server)"
    return ""


def start_redis(procs: ProcessGroup, workdir: Path) -> str:
    """A throwaway Redis on a free loopback port (no persistence); returns its URL."""
    port = free_port()
    log = workdir / "redis.log"
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", str(workdir)]
    proc = procs.start(cmd, log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{log_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server not ready:\n{log_tail(log)}")


def direct(upstream: Upstream) -> Target:
    return Target(
        "direct",
        url=upstream.base + nginx.NON_STREAM_PATH,
        stream_url=upstream.base + nginx.STREAM_PATH,
        pid=upstream.pid,
        note="nginx fixed answer",
    )


def bare(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    port = free_port()
    log = workdir / "bare.log"
    cmd = [sys.executable, str(BENCH / "bare_passthrough.py"), str(port), upstream.base]
    proc = procs.start(cmd, log)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, 20, log)
    return Target(
        "bare",
        url=base + nginx.NON_STREAM_PATH,
        stream_url=base + nginx.STREAM_PATH,
        pid=proc.pid,
        note="uvicorn+httptools+uvloop, raw ASGI, aiohttp",
    )


def nginx_proxy(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """nginx relaying to ``upstream`` unbuffered: what a relay in C costs on this machine."""
    prefix = workdir / "nginx-proxy"
    prefix.mkdir()
    port = free_port()
    cmd = nginx.nginx_command(prefix, port, upstream.port)
    proc = procs.start(cmd, workdir / "proxy.log")
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/health", proc, 10, prefix / "error.log")
    version = subprocess.run([cmd[0], "-v"], capture_output=True, text=True, check=False)
    version_text = version.stderr.strip().removeprefix("nginx version: ")
    return Target(
        "nginx-proxy",
        url=base + nginx.NON_STREAM_PATH,
        stream_url=base + nginx.STREAM_PATH,
        pid=proc.pid,
        note=f"{version_text}, 1 worker process, proxy_buffering off",
    )


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``extra`` into ``base``: mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def ballast_config(
    port: int,
    upstream: Upstream,
    extra: dict[str, Any] | None,
    assemble: bool = False,
    anthropic: bool = False,
) -> dict[str, Any]:
    """`assemble`: whole answers come from the streaming location, so each is read as a
    stream and put back together (routing.answers_as_streams) instead of passing through.
    `anthropic`: the same OpenAI-shaped requests go to the Anthropic adapter, answered by
    the upstream's fixed answer in the Messages wire."""
    provider = "anthropic" if anthropic else "openai"

    def deployment(dep_id: str, path: str, model: str) -> dict[str, str]:
        if anthropic:
            path = nginx.ANTHROPIC_STREAM_PREFIX if "stream" in path else nginx.ANTHROPIC_PREFIX
            path += "/v1"
        return {
            "id": dep_id,
            "url": upstream.base + path,
            "api_key": "sk-bench",
            "model": model,
            "provider": provider,
        }

    whole_path = (nginx.STREAM_PREFIX if assemble else "") + "/v1"
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "models": [
            {
                "name": "bench-model",
                "deployments": [deployment("nginx", whole_path, "bench-model")],
            },
            {
                "name": "bench-stream",
                "deployments": [
                    deployment("nginx-stream", nginx.STREAM_PREFIX + "/v1", "bench-stream")
                ],
            },
        ],
    }
    return _merge(config, extra) if extra else config


def _ballast_env() -> dict[str, str]:
    return {"PYTHONPATH": str(REPO / "src")}


def _serve_help() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ballast", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **_ballast_env()},
        check=False,
    )


def ballast_missing() -> str:
    """Why ``ballast serve`` cannot run here, or ``""`` when it can."""
    probe = _serve_help()
    if probe.returncode == 0 and "--config" in probe.stdout:
        return ""
    lines = (probe.stderr or probe.stdout).strip().splitlines()
    return "`ballast serve` not available: " + (lines[-1] if lines else f"rc {probe.returncode}")


def ballast(
    procs: ProcessGroup,
    workdir: Path,
    upstream: Upstream,
    name: str = "ballast",
    workers: int = 1,
    extra: dict[str, Any] | None = None,
    key: str = "sk-bench",
    assemble: bool = False,
    anthropic: bool = False,
) -> Target:
    missing = ballast_missing()
    if missing:
        return Target(name, unavailable=missing)
    port = free_port()
    slug = name.replace("+", "-")
    conf = workdir / f"{slug}.yaml"
    config = ballast_config(port, upstream, extra, assemble, anthropic)
    conf.write_text(yaml.safe_dump(config, sort_keys=False))
    log = workdir / f"{slug}.log"
    cmd = [sys.executable, "-m", "ballast", "serve", "--config", str(conf)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    if "--log-level" in _serve_help().stdout:
        cmd += ["--log-level", "warning"]  # as quiet as the others: no per-request lines
    note = f"{workers} worker(s), log level warning if supported"
    note += ", with --ballast-config-extra" if extra else ""
    return _serve(procs, name, cmd, log, _ballast_env(), port, note, key=key)


def _serve(
    procs: ProcessGroup,
    name: str,
    cmd: list[str],
    log: Path,
    env: dict[str, str],
    port: int,
    note: str,
    *,
    key: str = "sk-bench",
    health: str = "/health",
    ready_within: float = 60.0,
) -> Target:
    """Start a gateway, wait for its health check and one real completion through it; a
    gateway that fails either is stopped and reported unavailable with the reason."""
    proc = procs.start(cmd, log, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + health, proc, ready_within, log)
    except RuntimeError as exc:
        procs.stop(proc)
        return Target(name, unavailable=f"did not start: {_first_line(exc)}")
    problem = _smoke(base + nginx.NON_STREAM_PATH, key)
    if problem:
        procs.stop(proc)
        return Target(name, unavailable=f"smoke request failed: {problem}")
    url = base + nginx.NON_STREAM_PATH
    return Target(name, url=url, stream_url=url, pid=proc.pid, note=note, key=key)


def ballast_messages(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """Ballast as above, loaded through the Anthropic Messages shape (`/v1/messages`, whole
    answers and streams translated from and to the same chat upstream): what the shape's
    translation costs against the chat path."""
    target = ballast(procs, workdir, upstream, name="ballast-messages")
    if target.ok:
        target.url = target.stream_url = target.url.replace(nginx.NON_STREAM_PATH, "/v1/messages")
        target.shape = "messages"
        target.note = "1 worker, Anthropic Messages in, chat upstream out"
    return target


def ballast_messages_native(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """Ballast loaded through `/v1/messages` in front of a Messages upstream (`provider:
    anthropic`, native pass-through: the client's body goes as it came, the provider's
    events come back as they were sent): what the native path costs against the chat path."""
    target = ballast(procs, workdir, upstream, name="ballast-messages-native", anthropic=True)
    if target.ok:
        target.url = target.stream_url = target.url.replace(nginx.NON_STREAM_PATH, "/v1/messages")
        target.shape = "messages"
        target.note = "1 worker, Anthropic Messages in, passed through to a Messages upstream"
    return target


def ballast_responses(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """Ballast asked on /v1/responses for the same answers, bridged to the same chat
    upstream: what the Responses shape's translation costs against a chat request."""
    target = ballast(procs, workdir, upstream, name="ballast-responses")
    if target.ok:
        target.url = target.url.replace(nginx.NON_STREAM_PATH, "/v1/responses")
        target.stream_url = target.url
        target.shape = "responses"
        target.note += "; POST /v1/responses, bridged to chat completions"
    return target


def ballast_granian(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """Ballast's ASGI app served by granian (a Rust HTTP server) instead of uvicorn, one
    worker: the other server worth trying. For comparison only: Ballast ships on uvicorn,
    whose protocol carries its header-time and header-size guards."""
    name = "ballast-granian"
    if importlib.util.find_spec("granian") is None:
        return Target(name, unavailable="granian is not installed (pip install granian)")
    port = free_port()
    conf = workdir / f"{name}.yaml"
    conf.write_text(yaml.safe_dump(ballast_config(port, upstream, None), sort_keys=False))
    log = workdir / f"{name}.log"
    cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--loop", "uvloop"]
    cmd += ["--http", "1", "--no-ws", "--workers", "1", "--log-level", "warning"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--factory", "ballast.app:app_from_env"]
    env = {**_ballast_env(), "BALLAST_CONFIG": str(conf)}
    version = importlib.metadata.version("granian")
    note = f"Ballast's app under granian {version} (ASGI, uvloop), 1 worker"
    return _serve(procs, name, cmd, log, env, port, note)


def keys_config(workdir: Path, slug: str, redis_url: str | None) -> dict[str, Any]:
    """What the keys+limits+spend variants add: a master key, the embedded SQLite database
    and spend journal in the bench's directory, prices (so spend is computed), and Redis for
    keys, limits and spend counters when given."""
    state: dict[str, Any] = {
        "database_url": f"sqlite:///{workdir / slug}.db",
        "spend_journal": str(workdir / f"{slug}-spend.journal"),
    }
    if redis_url:
        state["redis_url"] = redis_url
    return {
        "server": {"master_key": BENCH_MASTER},
        "state": state,
        "prices": {
            "bench-model": {"input": 1.0, "output": 2.0},
            "bench-stream": {"input": 1.0, "output": 2.0},
        },
    }


def create_key(
    workdir: Path, upstream: Upstream, extra: dict[str, Any], src: Path = REPO / "src"
) -> str:
    """A virtual key for the keys variants, made with `ballast keys create` (RuntimeError
    with the reason when that fails)."""
    conf = workdir / "keys-create.yaml"
    conf.write_text(yaml.safe_dump(ballast_config(0, upstream, extra), sort_keys=False))
    cmd = [sys.executable, "-m", "ballast", "keys", "create", "--config", str(conf)]
    cmd += ["--name", "bench", *KEY_LIMITS]
    made = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(src)},
        check=False,
    )
    for line in made.stdout.splitlines():
        if made.returncode == 0 and line.startswith("key:"):
            return line.split(":", 1)[1].strip()
    lines = (made.stderr or made.stdout).strip().splitlines()
    raise RuntimeError(lines[-1] if lines else f"rc {made.returncode}")


def ballast_with_keys(
    procs: ProcessGroup, workdir: Path, upstream: Upstream, name: str, redis_url: str | None
) -> Target:
    """Ballast with a virtual key, rate limits, a budget and spend recording."""
    missing = ballast_missing()
    if missing:
        return Target(name, unavailable=missing)
    extra = keys_config(workdir, name.replace("+", "-"), redis_url)
    try:
        key = create_key(workdir, upstream, extra)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return Target(name, unavailable=f"could not create a key: {_first_line(exc)}")
    target = ballast(procs, workdir, upstream, name=name, extra=extra, key=key)
    if target.ok:
        target.note = "1 worker, a virtual key with RPM/TPM/parallel limits and a budget, " + (
            "spend recorded; keys, limits and spend counters in Redis"
            if redis_url
            else "spend recorded; embedded SQLite, local limits"
        )
    return target


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " | ".join(text[:1] + text[-2:]) if text else type(exc).__name__


def _smoke(url: str, key: str = "sk-bench") -> str:
    """One real request through a gateway: ``""`` when it answers a completion."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        url,
        data=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read()[:200]!r}"
    except (OSError, ValueError) as exc:
        return repr(exc)
    return "" if data.get("choices") else f"unexpected body {str(data)[:200]}"


# --- LiteLLM -------------------------------------------------------------------------


def litellm_installed_version() -> str:
    python = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        return ""
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else ""


def ensure_litellm(log: Path) -> str:
    """Install ``litellm[proxy]`` (pinned) into its own virtualenv once; return the version."""
    version = litellm_installed_version()
    if version == LITELLM_VERSION:
        return version
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.relative_to(REPO)}")
    python = LITELLM_VENV / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", f"litellm[proxy]=={LITELLM_VERSION}"],
    ]
    with log.open("ab") as out:
        for step in steps:
            done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"`{' '.join(step[-3:])}` failed:\n{log_tail(log, 5)}")
    return litellm_installed_version()


def litellm_config(upstream: Upstream) -> dict[str, Any]:
    def entry(name: str, path: str) -> dict[str, Any]:
        return {
            "model_name": name,
            "litellm_params": {
                "model": f"openai/{name}",
                "api_base": upstream.base + path,
                "api_key": "sk-bench",
            },
            # Priced, so cost tracking runs its normal path instead of failing per call.
            "model_info": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
        }

    return {
        "model_list": [
            entry("bench-model", "/v1"),
            entry("bench-stream", nginx.STREAM_PREFIX + "/v1"),
        ],
        "litellm_settings": {"telemetry": False, "set_verbose": False},
        # It refuses to start without a master key; the bench already sends this one.
        "general_settings": {"master_key": "sk-bench"},
    }


def litellm(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    try:
        version = ensure_litellm(workdir / "litellm-install.log")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return Target("litellm", unavailable=f"install failed: {_first_line(exc)}")
    port = free_port()
    conf = workdir / "litellm.yaml"
    conf.write_text(yaml.safe_dump(litellm_config(upstream), sort_keys=False))
    log = workdir / "litellm.log"
    cmd = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(conf)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch at start-up
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
    }
    note = f"LiteLLM proxy {version}, 1 worker, no DB, master key auth"
    return _serve(
        procs, "litellm", cmd, log, env, port, note, health="/health/liveliness", ready_within=180
    )


# --- Portkey's gateway ----------------------------------------------------------------

PORTKEY_VERSION = "1.15.2"
# What Portkey's own lockfile (v1.15.2) resolves: a plain install takes newer releases of
# both, whose node server answers every stream with a 500.
PORTKEY_PINS = {"hono": "4.9.7", "@hono/node-server": "1.13.5"}
PORTKEY_DIR = BENCH / ".portkey"  # git-ignored; made by the bench, never committed
PORTKEY_MAIN = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build"


def ensure_portkey(log: Path) -> str:
    """Install Portkey's gateway (pinned, with its lockfile's hono) into bench/.portkey."""
    installed = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
    if installed.exists() and json.loads(installed.read_text())["version"] == PORTKEY_VERSION:
        return PORTKEY_VERSION
    if not shutil.which("npm") or not shutil.which("node"):
        raise RuntimeError("node and npm are needed (apt-get install -y nodejs npm)")
    PORTKEY_DIR.mkdir(exist_ok=True)
    package = {
        "name": "portkey-bench",
        "private": True,
        "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION, **PORTKEY_PINS},
        "overrides": PORTKEY_PINS,
    }
    (PORTKEY_DIR / "package.json").write_text(json.dumps(package, indent=1))
    print(f"installing @portkey-ai/gateway@{PORTKEY_VERSION} into bench/.portkey")
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts"]
    with log.open("ab") as out:
        done = subprocess.run(
            cmd, cwd=PORTKEY_DIR, stdout=out, stderr=subprocess.STDOUT, timeout=900
        )
    if done.returncode != 0:
        raise RuntimeError(f"npm install failed:\n{log_tail(log, 5)}")
    return PORTKEY_VERSION


def portkey(procs: ProcessGroup, workdir: Path, upstream: Upstream) -> Target:
    """Portkey's gateway on Node, bound to loopback (bench/portkey_loopback.cjs: it has no
    host option and listens on every interface otherwise); requests name the upstream in
    Portkey's own headers."""
    try:
        version = ensure_portkey(workdir / "portkey-install.log")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return Target("portkey", unavailable=f"install failed: {_first_line(exc)}")
    port = free_port()
    log = workdir / "portkey.log"
    cmd = ["node", "--require", str(BENCH / "portkey_loopback.cjs")]
    cmd += [str(PORTKEY_MAIN / "start-server.js"), f"--port={port}", "--headless"]
    env = {"NODE_ENV": "production"}
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False)
    note = f"Portkey gateway {version} (hono 4.9.7), Node {node.stdout.strip()}, 1 process"
    proc = procs.start(cmd, log, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/", proc, 60, log)
    except RuntimeError as exc:
        procs.stop(proc)
        return Target("portkey", unavailable=f"did not start: {_first_line(exc)}")
    url = base + nginx.NON_STREAM_PATH
    target = Target("portkey", url=url, stream_url=url, pid=proc.pid, note=note)
    target.headers = {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": upstream.base + "/v1",
    }
    target.stream_headers = {
        **target.headers,
        "x-portkey-custom-host": upstream.base + nginx.STREAM_PREFIX + "/v1",
    }
    return target

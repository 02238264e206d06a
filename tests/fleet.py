"""A fleet on one machine: Ballast instances (`ballast serve --workers 2`, each a process
tree of its own, in a directory of its own) sharing Redis and PostgreSQL, behind Debian's
nginx on loopback, as deploy/ describes it. The tests count what reaches the simulator."""

from __future__ import annotations

import contextlib
import functools
import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.sim.server import SimServer
from tests.e2e.test_workers import workers
from tests.stack import Stack, deployment, free_port, serve, wait_for

MASTER = "sk-fleet-master-0123456789"
THRESHOLD = 3  # the deployments' failure_threshold
LATENCY = 0.2  # each answer of the broken deployment takes this long: overlaps would show
REDIS_TIMEOUT = 0.25  # generous: six workers, nginx and the simulators share two cores
REQUEST_TIMEOUT = 5.0
_ids = itertools.count()


def nginx_config(prefix: Path, port: int, instances: list[int]) -> str:
    """deploy/nginx.conf's proxy, on loopback ports, every path inside `prefix`; without
    keep-alive to the instances, so that each request is a new connection and the kernel
    spreads them over every worker (a few kept connections would each stay on one)."""
    temp = {name: prefix / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    servers = "\n".join(
        f"        server 127.0.0.1:{p} max_fails=3 fail_timeout=5s;" for p in instances
    )
    return f"""
worker_processes 1;
daemon off;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    upstream ballast {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://ballast;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
            proxy_next_upstream error;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """Debian's nginx; without it a test is skipped locally and fails on CI."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if found:
        return found
    if os.environ.get("CI") is not None:
        pytest.fail("nginx is not installed", pytrace=False)
    pytest.skip("nginx is not installed")


class Machine:
    """`instances` Ballast instances of two workers each behind one nginx port."""

    def __init__(self, folder: Path, config: dict[str, Any], instances: int) -> None:
        self.folder = folder
        self.config = config
        self.ports = [free_port() for _ in range(instances)]
        self.port = free_port()  # nginx's
        self.processes: list[subprocess.Popen[bytes]] = []
        self.nginx: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for n, port in enumerate(self.ports):
            home = self.folder / f"i{n}"
            home.mkdir()
            path = home / "ballast.yaml"
            path.write_text(yaml.safe_dump(self.config))
            log = (home / "stderr.log").open("wb")
            env = {"BALLAST_INSTANCE_ID": f"i{n}"}
            self.processes.append(serve(path, port, workers=2, stderr=log, env=env))
            log.close()  # the child holds its own copy
        prefix = self.folder / "nginx"
        prefix.mkdir()
        conf = prefix / "nginx.conf"
        conf.write_text(nginx_config(prefix, self.port, self.ports))
        binary = nginx_binary()
        self.nginx = subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(prefix), "-e", str(prefix / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for process, port in zip(self.processes, self.ports, strict=True):
            wait_for(functools.partial(self.started, process, port), timeout=40)
        wait_for(lambda: _status(self.port, "/health") == 200, timeout=10)

    def started(self, process: subprocess.Popen[bytes], port: int) -> bool:
        """Both workers of the instance on `port` are ready and, where it is shared, hear the
        fleet's upstream health."""
        if len(workers(process.pid)) != 2:
            return False
        own = self.workers(port)
        sharing = self.config.get("fleet", {}).get("share_health", True)
        return len(own) == 2 and all(w["ready"] and w["health_shared"] == sharing for w in own)

    def workers(self, port: int) -> list[dict[str, Any]]:
        """The instance's own workers, asked live over its sockets (not from heartbeats)."""
        try:
            status, state = request(port, "GET", "/admin/state")
        except OSError:
            return []
        if status != 200:
            return []
        name = f"i{self.ports.index(port)}"
        return [w for w in state["fleet"]["workers"] if w["instance"] == name]

    def breakers(self, deployment: str) -> list[str]:
        """The deployment's breaker on every worker of every instance."""
        return [w["breakers"].get(deployment, "?") for p in self.ports for w in self.workers(p)]

    def statements(self) -> int:
        """Database statements sent so far by every worker of every instance still running."""
        return sum(int(w["db_statements"]) for p in self.ports for w in self.workers(p))

    def restart(self, index: int) -> None:
        """Start the instance at `index` again in its own directory (its spend journal is
        there: what it had not flushed is replayed)."""
        home = self.folder / f"i{index}"
        log = (home / "stderr.log").open("ab")
        env = {"BALLAST_INSTANCE_ID": f"i{index}"}
        process = serve(home / "ballast.yaml", self.ports[index], workers=2, stderr=log, env=env)
        log.close()
        self.processes[index] = process
        wait_for(functools.partial(self.started, process, self.ports[index]), timeout=40)

    def kill(self, index: int) -> None:
        """kill -9 of one instance: its supervisor and its workers at once."""
        process = self.processes[index]
        for pid in [*workers(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.send_signal(signal.SIGQUIT)
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in [*self.processes, *([self.nginx] if self.nginx else [])]:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def request(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = json.dumps(body) if body is not None else None
        sent = {"authorization": f"Bearer {MASTER}", "content-type": "application/json"}
        connection.request(method, path, data, {**sent, **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        if response.getheader("content-type", "").startswith("application/json"):
            return response.status, json.loads(raw)
        return response.status, raw.decode(errors="replace")  # nginx's own error page
    finally:
        connection.close()


def _status(port: int, path: str) -> int:
    try:
        return request(port, "GET", path)[0]
    except OSError:
        return 0


@contextlib.contextmanager
def machine(folder: Path, config: dict[str, Any], instances: int) -> Iterator[Machine]:
    nginx_binary()
    fleet = Machine(folder, config, instances)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def settle(seconds: float) -> None:
    """Real time passing on the fleet's processes (their clocks are their own)."""
    time.sleep(seconds)


class Upstreams:
    """The simulators the fleet's deployments point at (in this process)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.limited = stack.sim("429?retry_after=20", name="limited")
        self.limited_later = stack.sim("429?retry_after=20", name="limited-later")
        self.dead = stack.sim("500", name="dead")
        self.healthy = stack.sim("ok?tokens=2", name="healthy")
        # Deployment ids of this run's own: what the fleet shares outlives it in Redis.
        run = uuid.uuid4().hex[:8]
        self.ids = {
            name: f"{name}-{run}"
            for name in (
                "limited",
                "limited-later",
                "dead",
                "spare-1",
                "spare-2",
                "spare-3",
                "steady",
            )
        }

    def attempts(self, sim: SimServer) -> list[dict[str, Any]]:
        return self.stack.attempts(sim)


def fleet_config(
    up: Upstreams, redis_url: str, database_url: str, share_health: bool = True
) -> dict[str, Any]:
    """Two model groups, each a broken deployment first and a healthy spare after it."""

    def ordered(name: str, sim: SimServer, spare: str) -> dict[str, Any]:
        first = deployment(up.ids[name], sim, "m")
        spare_dep = deployment(up.ids[spare], up.healthy, "m")
        return {"name": name, "strategy": "ordered", "deployments": [first, spare_dep]}

    return {
        "server": {"master_key": MASTER},
        "fleet": {"share_health": share_health},
        "state": {
            "redis_url": redis_url,
            "database_url": database_url,
            "redis_timeout": REDIS_TIMEOUT,
            "redis_breaker": {"open_time": 1.0, "probe_timeout": REDIS_TIMEOUT},
        },
        # Grants of a killed instance lapse in seconds here (a minute and more by default).
        "budgets": {"grant_accept_for": 1.0, "grant_lapse_margin": 0.5},
        "timeouts": {"request": REQUEST_TIMEOUT},
        "prices": {"m": {"input": 1.0, "output": 1.0}},
        "routing": {
            "max_retry_after_wait": 0,
            "breaker": {
                "failure_threshold": THRESHOLD,
                "failure_rate": None,
                "open_time": 2,
                "probe_interval": 0.5,
                "max_probe_interval": 0.5,
                "probe_timeout": 2,
            },
        },
        "models": [
            ordered("limited", up.limited, "spare-1"),
            ordered("dead", up.dead, "spare-2"),
            ordered("limited-later", up.limited_later, "spare-3"),
            {"name": "steady", "deployments": [deployment(up.ids["steady"], up.healthy, "m")]},
        ],
    }


def load(
    port: int,
    model: str,
    count: int,
    concurrency: int = 4,
    pause: float = 0.1,
    key: str = MASTER,
    took: list[float] | None = None,
) -> list[int]:
    """`count` chat requests through nginx from `concurrency` clients, each pausing `pause`
    after each answer, their starts spread over one pause: traffic that reaches every worker,
    without all of it in flight at the moment of the first verdict (requests already sent
    then are bounded by the concurrency, not by what the fleet shares). Their statuses. Each
    carries a request id, which the simulator logs: the attempts without one are probes.
    `took`, when given, receives each request's seconds."""

    def client(k: int) -> list[int]:
        time.sleep(k * pause / concurrency)
        statuses = []
        for _ in range(k, count, concurrency):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            headers = {"x-request-id": f"client-{next(_ids)}", "authorization": f"Bearer {key}"}
            started = time.monotonic()
            statuses.append(request(port, "POST", "/v1/chat/completions", body, headers)[0])
            if took is not None:
                took.append(time.monotonic() - started)
            time.sleep(pause)
        return statuses

    with ThreadPoolExecutor(concurrency) as pool:
        return [s for statuses in pool.map(client, range(concurrency)) for s in statuses]


def from_clients(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in attempts if str(a["headers"].get("x-request-id", "")).startswith("client-")]


def cooldown_attempts(
    fleet: Machine, up: Upstreams, group: str = "limited"
) -> tuple[list[int], int]:
    """40 requests while the group's first deployment answers 429 with `Retry-After: 20`:
    their statuses, and how many reached it."""
    statuses = load(fleet.port, group, 40)
    sim = up.limited if group == "limited" else up.limited_later
    return statuses, len(up.attempts(sim))


def create_key(port: int, budget: float = 1e9) -> tuple[str, str]:
    """A virtual key with a budget (its lookups, limits and reservations use the fleet's
    Redis): (its secret, its id)."""
    status, made = request(port, "POST", "/admin/keys", {"name": "fleet", "budget": budget})
    assert status == 201, made
    return str(made["key"]), str(made["id"])


def dead_attempts(fleet: Machine, up: Upstreams) -> tuple[list[int], int]:
    """30 requests while the dead deployment answers 500: their statuses, and how many
    failed attempts of the clients' it cost."""
    statuses = load(fleet.port, "dead", 30)
    return statuses, len(from_clients(up.attempts(up.dead)))

"""A fleet on one machine: Ballast instances (`ballast serve --workers 2`, each a process
tree of its own, in a directory of its own) sharing Redis and PostgreSQL, behind Debian's
nginx on loopback, as deploy/ describes it. The tests count what reaches the simulator."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_workers import workers
from tests.stack import free_port, serve, wait_for

MASTER = "sk-fleet-master-0123456789"


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
        """Both workers of the instance on `port` are ready and hear the fleet's health."""
        if len(workers(process.pid)) != 2:
            return False
        own = self.workers(port)
        return len(own) == 2 and all(w["ready"] and w["health_shared"] for w in own)

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
        return response.status, json.loads(raw) if raw else None
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

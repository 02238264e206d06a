"""A real stack on loopback for tests: simulators and a Ballast gateway served by uvicorn,
running in a background event loop so both the sync and async OpenAI clients can talk to it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar

import uvicorn

from ballast.app import BallastApp
from ballast.config import Settings, parse_settings
from ballast.server.protocol import GuardedHttpToolsProtocol
from ballast.sim.server import SimServer, start_sim

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class Gateway:
    def __init__(
        self, app: BallastApp, server: uvicorn.Server, port: int, task: asyncio.Task[None]
    ) -> None:
        self.app = app
        self.task = task
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    @property
    def router(self) -> Any:
        return self.app.router


class Stack:
    """Owns every server a test starts, and stops them all at the end."""

    def __init__(self) -> None:
        self.thread = LoopThread()
        self.sims: list[SimServer] = []
        self.gateways: list[Gateway] = []

    def sim(self, default: str = "ok", name: str = "sim") -> SimServer:
        server = self.thread.run(start_sim(default=default, name=name))
        self.sims.append(server)
        return server

    def gateway(self, config: dict[str, Any] | Settings) -> Gateway:
        settings = config if isinstance(config, Settings) else parse_settings(config)
        return self.thread.run(self._start_gateway(settings))

    async def _start_gateway(self, settings: Settings) -> Gateway:
        app = BallastApp(settings)
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted connections of a
        # socket whose proto says TCP, and without it every response written in two parts
        # (headers, then body) waits ~40 ms for the client's delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        # The production protocol, with this gateway's header limits.
        protocol = type(
            "Protocol",
            (GuardedHttpToolsProtocol,),
            {
                "header_timeout": settings.server.header_timeout,
                "max_header_bytes": settings.server.max_header_bytes,
                "client_write_timeout": settings.server.client_write_timeout,
            },
        )
        config = uvicorn.Config(
            app, http=protocol, lifespan="on", log_level="warning", access_log=False
        )
        server = uvicorn.Server(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        gateway = Gateway(app, server, port, task)
        self.gateways.append(gateway)
        return gateway

    def set_behaviour(self, sim: SimServer, behaviour: str, model: str = "*") -> None:
        _http("PUT", sim.url + "/sim/behaviour", {"model": model, "behaviour": behaviour})

    def attempts(self, sim: SimServer) -> list[dict[str, Any]]:
        attempts: list[dict[str, Any]] = _http("GET", sim.url + "/sim/log")["attempts"]
        return attempts

    def clear_log(self, sim: SimServer) -> None:
        _http("DELETE", sim.url + "/sim/log")

    def close(self) -> None:
        async def shutdown() -> None:
            for gateway in self.gateways:
                gateway.server.should_exit = True
            for gateway in self.gateways:
                try:
                    await asyncio.wait_for(gateway.task, 10)
                except (TimeoutError, asyncio.CancelledError):
                    pass
            for sim in self.sims:
                await sim.close()
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.thread.run(shutdown(), timeout=15)
        finally:
            self.thread.stop()


def sqlite_state(folder: Path, **settings: Any) -> dict[str, Any]:
    """A gateway's `state` section keeping its SQLite database and spend journal in `folder`."""
    return {
        "database_url": f"sqlite:///{folder / 'ballast.db'}",
        "spend_journal": str(folder / "spend.journal"),
        **settings,
    }


def group(name: str, *deployments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "deployments": list(deployments), **extra}


def deployment(
    dep_id: str, sim: SimServer, model: str | None = None, **extra: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": dep_id, "url": sim.url + "/v1", "api_key": f"sk-{dep_id}-secret"}
    if model is not None:
        entry["model"] = model
    entry.update(extra)
    return entry


def _http(method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `predicate` until it holds: for state a server settles after its last byte."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(
    config: Path,
    port: int,
    workers: int,
    stderr: int | IO[bytes] = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`ballast serve` as a process of its own, in the config's directory, with a metrics
    directory of its own when it has several workers; `env` adds to the environment."""
    command = [sys.executable, "-m", "ballast", "serve", "--config", str(config)]
    command += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    inherited = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.Popen(
        command,
        env={**inherited, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        cwd=config.parent,
    )

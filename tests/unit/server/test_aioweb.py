"""A service that cannot bind its port (the simulator, the sampling actor) says so in one
line and exits 1: no traceback, and the address it wanted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from aiohttp import web

from ballast.server.aioweb import CannotListen, start_site


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


async def test_a_busy_port_is_one_error_naming_the_address(busy_port: int) -> None:
    with pytest.raises(CannotListen) as caught:
        await start_site(web.Application(), "127.0.0.1", busy_port, shutdown_timeout=0.1)
    assert (
        caught.value.strerror == f"cannot listen on 127.0.0.1:{busy_port}: address already in use"
    )


def _ballast(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ballast", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


def test_ballast_sim_on_a_busy_port_prints_one_line(busy_port: int) -> None:
    result = _ballast("sim", "--port", str(busy_port))
    assert result.returncode == 1
    assert result.stderr == (
        f"ballast sim: cannot listen on 127.0.0.1:{busy_port}: address already in use\n"
    )


def test_ballast_actor_on_a_busy_port_prints_one_line(busy_port: int) -> None:
    secrets = {
        "BALLAST_ACTOR_CONTROL_SECRET": "control-secret-for-the-test",
        "BALLAST_ACTOR_JWT_SECRET": "j" * 40,
    }
    result = _ballast(
        "actor", "--backend", "http://127.0.0.1:9", "--port", str(busy_port), **secrets
    )
    assert result.returncode == 1
    assert result.stderr.endswith(
        f"ballast actor: cannot listen on 127.0.0.1:{busy_port}: address already in use\n"
    )
    assert "Traceback" not in result.stderr

"""`ballast serve --workers 2` as real processes: keep-alive connections opened together
spread over both workers, and a worker killed with -9 is replaced on its own socket, with no
new connection refused meanwhile."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ballast.server.serving import balances_reuse_port
from tests.stack import Stack, deployment, free_port, group, serve, wait_for

pytestmark = pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT")

BODY = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})


def workers(parent: int) -> list[int]:
    """The supervisor's worker processes: its children that hold a listening socket."""
    return [pid for pid in _children(parent) if _sockets(pid)]


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == parent:  # the field after the state is the parent's pid
            found.append(int(stat.parent.name))
    return sorted(found)


def _sockets(pid: int) -> set[str]:
    found: set[str] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # gone
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def connections_per_worker(parent: int, port: int) -> dict[int, int]:
    """Established connections to `port` that each worker accepted (by socket inode)."""
    established = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":
            established.add(fields[9])
    return {pid: len(_sockets(pid) & established) for pid in workers(parent)}


def ask(connection: http.client.HTTPConnection) -> int:
    connection.request("POST", "/v1/chat/completions", BODY, {"content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response.status


@pytest.fixture
def served(stack: Stack, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    sim = stack.sim("ok?tokens=2")
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump({"models": [group("chat", deployment("a", sim))]}))
    port = free_port()
    process = serve(path, port, workers=2, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(workers(process.pid)) == 2, timeout=30)
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr.decode()[-2000:]
        assert not re.search(rb"Traceback", stderr), stderr.decode()[-2000:]


@contextlib.contextmanager
def answered(port: int, count: int) -> Iterator[None]:
    """`count` keep-alive connections opened together, each answered once, held open."""
    clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=20) for _ in range(count)]
    try:
        for client in clients:
            client.connect()
        assert all(ask(client) == 200 for client in clients)
        yield
    finally:
        for client in clients:
            client.close()


def test_connections_opened_together_spread_over_both_workers(
    served: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = served
    with answered(port, 24):
        counts = connections_per_worker(process.pid, port)
        assert sum(counts.values()) == 24
        assert len(counts) == 2 and min(counts.values()) > 0, counts  # 0: about 1 in 4 million


def test_a_killed_worker_is_replaced_on_its_socket_and_no_connection_is_refused(
    served: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = served
    victim, survivor = workers(process.pid)
    os.kill(victim, signal.SIGKILL)
    # Connections hashed to the dead worker's socket wait there for its replacement.
    with answered(port, 16):
        now = workers(process.pid)
        assert survivor in now and victim not in now and len(now) == 2
        counts = connections_per_worker(process.pid, port)
        assert sum(counts.values()) == 16
        assert min(counts.values()) > 0, counts  # the replacement took over the socket


def test_sighup_replaces_each_worker_on_its_own_socket(
    served: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = served
    before = set(workers(process.pid))
    os.kill(process.pid, signal.SIGHUP)  # a rolling restart, one worker after the other

    def replaced() -> bool:
        now = set(workers(process.pid))
        return len(now) == 2 and not now & before

    wait_for(replaced, timeout=60)
    with answered(port, 24):
        counts = connections_per_worker(process.pid, port)
        assert sum(counts.values()) == 24 and min(counts.values()) > 0, counts

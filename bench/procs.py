"""Processes the bench starts: free loopback ports, readiness, cleanup, /proc accounting."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProcessGroup:
    """Every server the bench starts; ``stop_all`` ends each one's whole session."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, cmd: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches us, and we stop the group
            )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # Also reap anything left in the session (workers that outlived their parent).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)

    def stop_all(self) -> None:
        while self._procs:
            self.stop(self._procs.pop())


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    """Poll ``url`` until it answers 200; fail fast if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {timeout:.0f} s:\n{log_tail(log)}")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants."""
    tree = _children()
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(tree.get(pid, []))
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its parent's wait counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cpu_one(pid: int, system: bool | None = None) -> float:
    """User + system CPU seconds of `pid`; only system (True) or only user (False)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the comm field: state(0) ... utime(11) stime(12)
    user, kernel = int(fields[11]), int(fields[12])
    if system is None:
        return (user + kernel) / _TICK
    return (kernel if system else user) / _TICK


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of the live process tree under ``root``."""
    return sum(_cpu_one(pid) for pid in tree_pids(root))


def system_cpu_seconds(root: int) -> float:
    """The system (kernel) share of `cpu_seconds`: the syscalls' own cost, for one."""
    return sum(_cpu_one(pid, system=True) for pid in tree_pids(root))


def _hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(root: int) -> float:
    """Sum of each live process's peak resident set (VmHWM) in the tree, in MB."""
    return sum(_hwm_kb(pid) for pid in tree_pids(root)) / 1024


def wait_idle(root: int, quiet: float = 0.2, limit: float = 5.0) -> None:
    """Wait until the tree stops burning CPU (a backlog drained), at most ``limit`` s."""
    deadline = time.monotonic() + limit
    last = cpu_seconds(root)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu_seconds(root)
        if now - last < 0.02:
            return
        last = now


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt so cleanup always runs
    (SIGINT explicitly too: a shell may start a background job with it ignored)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in caught}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

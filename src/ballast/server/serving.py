"""`ballast serve`'s server: uvicorn's, with two changes.

- A second SIGTERM or SIGINT during the graceful shutdown exits at once (uvicorn forces only
  on a second SIGINT).
- With several workers on Linux, each worker accepts from a listening socket of its own, all
  bound to the one port with SO_REUSEPORT, so the kernel spreads connections over the
  workers. uvicorn shares one socket: whichever worker wakes first accepts, and a burst of
  keep-alive connections (a load balancer's pool, a benchmark's) can all land on one worker
  while the others idle. Measured with 32 connections and 2 workers: splits from 14/18 to
  32/0, and at 32/0 two workers served what one does. The supervisor (this process) owns
  the sockets: a worker that dies or is replaced leaves its socket, and the connections
  waiting in it, to its replacement, so none is refused meanwhile.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn
from uvicorn.supervisors.multiprocess import Multiprocess, Process

STARTUP_FAILURE = 3

log = logging.getLogger("ballast.serve")


class GatewayServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGINT, signal.SIGTERM):
            self.force_exit = True
        super().handle_exit(sig, frame)


def run_server(config: uvicorn.Config, reuse_port: bool = True) -> None:
    """What `uvicorn.run` does: one server, or several workers under a supervisor (which
    handles the signals itself). `reuse_port`: a listening socket per worker where the
    kernel balances them (see the module docstring); otherwise one shared socket."""
    if config.workers > 1:
        if reuse_port and balances_reuse_port() and config.uds is None and config.fd is None:
            try:
                slots = claim(config.host, config.port, config.workers, config.backlog)
            except OSError as exc:
                log.error("cannot listen on %s:%d: %s", config.host, config.port, exc.strerror)
                sys.exit(STARTUP_FAILURE)
            log.info(
                "listening on %s:%d, one socket per worker (%d)",
                config.host,
                slots[0].getsockname()[1],
                len(slots),
            )
            ListenerPerWorker(config, slots).run()
            return
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    # The socket is bound here rather than by uvicorn, so that it reaches the loop's
    # `create_server` as a socket, the case server/accept.py serves.
    sockets = None
    if config.uds is None and config.fd is None:
        try:
            sockets = [listener(config.host, config.port, config.backlog)]
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", config.host, config.port, exc.strerror)
            sys.exit(STARTUP_FAILURE)
        log.info("listening on %s:%d", config.host, sockets[0].getsockname()[1])
    server = GatewayServer(config)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    if not server.started and config.workers == 1:
        sys.exit(STARTUP_FAILURE)


def balances_reuse_port() -> bool:
    """Linux spreads connections over the sockets of a SO_REUSEPORT group; other systems
    accept the option but may hand every connection to one socket."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def claim(host: str, port: int, count: int, backlog: int = 2048) -> list[socket.socket]:
    """`count` listening sockets on (host, port), one SO_REUSEPORT group, on a port nothing
    listens on: OSError (EADDRINUSE) otherwise, even for another SO_REUSEPORT group (a
    second gateway started by mistake), which the kernel would let us join and split its
    traffic with."""
    if port != 0:
        _probe(_family(host), host, port)
    return listeners(host, port, count, backlog)


def listeners(host: str, port: int, count: int, backlog: int = 2048) -> list[socket.socket]:
    """`count` listening sockets on (host, port) with SO_REUSEPORT, joining any group of
    ours already there. Port 0: the first socket's port for all."""
    family = _family(host)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(backlog)  # queued here until a worker accepts, even before it starts
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """One listening socket on (host, port), for a single worker."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _probe(family: socket.AddressFamily, host: str, port: int) -> None:
    """A bind without SO_REUSEPORT succeeds only when nothing listens on the port."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, "address already in use") from None
            raise


class ListenerPerWorker(Multiprocess):
    """uvicorn's supervisor (health checks, SIGHUP rolling restarts, SIGTTIN/SIGTTOU), with
    `slots[i]` the listening socket of `processes[i]`. A replacement takes over its
    predecessor's socket; a rolling restart starts the new worker on it before the old one
    stops, so the two briefly share it."""

    def __init__(self, config: uvicorn.Config, slots: list[socket.socket]) -> None:
        super().__init__(config, sockets=[])
        self.slots = slots

    def _start(self, slot: int) -> Process:
        process = Process(self.config, [self.slots[slot]])
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes = [self._start(slot) for slot in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        for slot, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # It never served: the app, its config or TLS is broken, and a new worker
                # would fail the same way.
                log.error("worker %s failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            log.warning("worker %s died; starting another on its socket", process.pid)
            self.processes[slot] = self._start(slot)

    def restart_all(self) -> None:
        for slot, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._start(slot)
            timeout = self.config.timeout_worker_healthcheck
            if not new.wait_until_ready(timeout, self.should_exit):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    log.error("new worker %s not ready in time; restart aborted", new.pid)
                return
            old.terminate()
            old.join()
            self.processes[slot] = new

    def handle_ttin(self) -> None:
        try:
            port = self.slots[0].getsockname()[1]
            more = listeners(self.config.host, port, 1, self.config.backlog)[0]
        except OSError as exc:
            log.error("SIGTTIN: no socket for another worker: %s", exc.strerror)
            return
        self.slots.append(more)
        self.processes_num += 1
        self.processes.append(self._start(len(self.slots) - 1))

    def handle_ttou(self) -> None:
        if self.processes_num <= 1:
            log.info("SIGTTOU: one worker left; keeping it")
            return
        self.processes_num -= 1
        # The slot leaves the group first: once its worker stops accepting, connections
        # still sent to its socket would only wait there to be refused.
        self.slots.pop().close()
        process = self.processes.pop()
        process.terminate()
        process.join()

"""`ballast serve`'s server: uvicorn's, except that a second SIGTERM or SIGINT during the
graceful shutdown exits at once (uvicorn forces only on a second SIGINT)."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import uvicorn
from uvicorn.supervisors import Multiprocess

STARTUP_FAILURE = 3


class GatewayServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGINT, signal.SIGTERM):
            self.force_exit = True
        super().handle_exit(sig, frame)


def run_server(config: uvicorn.Config) -> None:
    """What `uvicorn.run` does: one server, or several workers under uvicorn's supervisor
    (which handles the signals itself)."""
    server = GatewayServer(config)
    if config.workers > 1:
        sock = config.bind_socket()
        Multiprocess(config, sockets=[sock]).run()
        return
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started and config.workers == 1:
        sys.exit(STARTUP_FAILURE)

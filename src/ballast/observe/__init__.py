"""Observability: Prometheus metrics, structured logs, and the events the dashboard shows."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

LOG_FORMATS = ("json", "text")


def prepare_serve(log_level: str, log_format: str, workers: int) -> None:
    """`ballast serve`, before uvicorn starts: logging for this process and (through the
    environment) for every worker, and a fresh multiprocess metrics directory when there
    is more than one worker."""
    from ballast.observe.logs import setup_logging

    if log_format not in LOG_FORMATS:
        print(f"--log-format must be one of {', '.join(LOG_FORMATS)}", file=sys.stderr)
        raise SystemExit(2)
    os.environ["BALLAST_LOG_LEVEL"] = log_level
    os.environ["BALLAST_LOG_FORMAT"] = log_format
    setup_logging(log_level, log_format)
    # One name for all of this instance's workers (the fleet view groups them by it).
    os.environ.setdefault("BALLAST_INSTANCE_ID", f"{os.uname().nodename}-{os.getpid()}")
    if workers > 1 and not os.environ.get("BALLAST_FLEET_DIR"):
        # Where the workers find each other to pass admin actions on (api/fleet.py).
        fleet = tempfile.mkdtemp(prefix="ballast-fleet-")
        os.environ["BALLAST_FLEET_DIR"] = fleet
        atexit.register(shutil.rmtree, fleet, True)
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Set before any worker imports prometheus_client: it picks its storage at import.
        directory = tempfile.mkdtemp(prefix="ballast-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        atexit.register(shutil.rmtree, directory, True)

"""Upstream attempts per scenario with shared upstream health on and off, side by side: a
fleet of `--instances` Ballast instances of two workers each behind Debian's nginx, sharing
Redis and PostgreSQL, on this machine (the same fleet and scenarios as
tests/integration/test_fleet_machine.py, counted at the simulator):

- cooldown: 40 requests while a deployment answers 429 with `Retry-After: 20`;
- dead: 30 requests while a deployment answers 500, `failure_threshold` 3.

Redis and PostgreSQL are the ones `scripts/services.sh start` prints:

    eval "$(scripts/services.sh start)"
    .venv/bin/python bench/fleet_health.py [--instances 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fleet on one machine is the test suite's (tests/fleet.py)

from tests.fleet import (  # noqa: E402
    THRESHOLD,
    Upstreams,
    cooldown_attempts,
    dead_attempts,
    fleet_config,
    machine,
)
from tests.stack import Stack  # noqa: E402


def run(share: bool, instances: int, redis_url: str, database_url: str) -> tuple[int, int]:
    """(attempts that reached the limited deployment, failed attempts at the dead one)."""
    stack = Stack()
    try:
        up = Upstreams(stack)
        with tempfile.TemporaryDirectory() as folder:
            config = fleet_config(up, redis_url, database_url, share_health=share)
            with machine(Path(folder), config, instances) as fleet:
                statuses, limited = cooldown_attempts(fleet, up)
                more, dead = dead_attempts(fleet, up)
        errors = sum(1 for s in statuses + more if s != 200)
        if errors:
            print(f"  ({errors} client requests were not answered)")
        return limited, dead
    finally:
        stack.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=3)
    args = parser.parse_args()
    redis_url = os.environ.get("BALLAST_TEST_REDIS_URL")
    database_url = os.environ.get("BALLAST_TEST_DATABASE_URL")
    if not redis_url or not database_url:
        sys.exit('start Redis and PostgreSQL first: eval "$(scripts/services.sh start)"')
    workers = args.instances * 2
    results = {
        share: run(share, args.instances, redis_url, database_url) for share in (True, False)
    }
    print(f"{args.instances} instances x 2 workers, failure_threshold {THRESHOLD}")
    print(f"{'scenario':<34} {'shared':>8} {'alone':>8}   bound when shared")
    on, off = results[True], results[False]
    print(f"{'429, Retry-After 20 (attempts)':<34} {on[0]:>8} {off[0]:>8}   <= {args.instances}")
    bound = THRESHOLD + args.instances
    print(f"{'dead (failed attempts)':<34} {on[1]:>8} {off[1]:>8}   <= {bound}")
    print(f"(alone, each of the {workers} workers learns for itself)")


if __name__ == "__main__":
    main()

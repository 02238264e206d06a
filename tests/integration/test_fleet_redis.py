"""Two gateways sharing Redis (and a database): drain, key revocation and reload sent to
one reach the other through Redis pub/sub well within a second, and `/admin/state` on
either shows both instances (their heartbeats) with the sums."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

from tests.e2e.test_fleet import BODY, PROMPTLY, _gateways, _request, _within
from tests.stack import Gateway, Stack, wait_for


def test_actions_reach_the_other_instance_through_redis(
    stack: Stack, tmp_path: Path, redis_url: str
) -> None:
    one, two = _gateways(stack, tmp_path, redis_url)
    wait = time.monotonic() + 10
    while not (one.app.fleet.subscribed and two.app.fleet.subscribed):
        assert time.monotonic() < wait
        time.sleep(0.02)
    status, body = _request(one.port, "POST", "/admin/deployments/b/drain")
    assert status == 200 and body["fleet"]["redis"] is True
    took = _within(lambda: two.router.targets["b"].drained, PROMPTLY)
    assert took < PROMPTLY / 2  # pub/sub, not the command log's poll
    status, created = _request(one.port, "POST", "/admin/keys", {"name": "k"})
    key = created["key"]
    chat = json.loads(BODY)
    assert _request(two.port, "POST", "/v1/chat/completions", chat, key)[0] == 200
    assert _request(one.port, "POST", "/admin/keys/revoke", {"id": created["id"]})[0] == 200
    assert (
        _within(
            lambda: _request(two.port, "POST", "/v1/chat/completions", chat, key)[0] == 401,
            PROMPTLY,
        )
        < PROMPTLY
    )
    assert _request(one.port, "POST", "/admin/reload")[0] == 200
    assert _within(lambda: two.app.generation.number == 2, PROMPTLY) < PROMPTLY

    def seen_from(gateway: Gateway) -> dict[str, object]:
        status, state = _request(gateway.port, "GET", "/admin/state")
        assert status == 200
        fleet: dict[str, object] = state["fleet"]
        return fleet

    def everyone_current(gateway: Gateway) -> bool:
        fleet: Any = seen_from(gateway)
        return (
            fleet["sum"]["instances"] == 2
            and {w["generation"] for w in fleet["workers"]} == {2}
            and all(w["drained"] == ["b"] for w in fleet["workers"])
        )

    # Another instance is shown as of its last heartbeat (fleet.heartbeat: 1 s).
    for gateway in (one, two):
        _within(lambda gateway=gateway: everyone_current(gateway), 3.0)
    fleet: Any = seen_from(two)
    assert fleet["sum"]["workers"] == 2 and fleet["other_instances_known"] is True
    assert sorted(g["workers"] for g in fleet["instances"].values()) == [1, 1]


def test_the_instances_sharing_the_limits_are_counted_not_configured(
    stack: Stack, tmp_path: Path, redis_url: str
) -> None:
    one, two = _gateways(stack, tmp_path, redis_url, instances=1)

    def counted(gateway: Gateway) -> bool:
        return gateway.app.fleet.instances_seen >= 2

    # Each worker beats every second (fleet.heartbeat); the beats name their instance.
    for gateway in (one, two):
        wait_for(functools.partial(counted, gateway), timeout=5)
    for gateway in (one, two):
        # Other tests' gateways may still be beating on this Redis: at least these two.
        assert gateway.app.state.limiter.instances == gateway.app.fleet.instances_seen >= 2

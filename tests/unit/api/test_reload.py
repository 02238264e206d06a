"""Config reload, in process: a swap keeps what is known about unchanged deployments, and the
old generation is closed after its grace on the app's clock, even with a request still
running on it. The app is driven through its ASGI callable (tests/unit/drive.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.config import parse_settings
from ballast.resilience.clock import ManualClock
from tests.unit.drive import Client, settings_tree, started, turns

MASTER = "sk-master-reload"
AUTH = [(b"authorization", f"Bearer {MASTER}".encode())]


def tree(tmp: Path, *deployments: tuple[str, str]) -> dict[str, Any]:
    config = settings_tree(tmp, "http://127.0.0.1:9/v1", master_key=MASTER, body_timeout=1000.0)
    config["timeouts"]["request"] = 1.0  # the grace of a retiring generation: 1 + 5 s
    config["models"][0]["deployments"] = [{"id": i, "url": url} for i, url in deployments]
    return config


async def test_the_old_generation_is_retired_after_its_grace_on_the_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    config = tree(tmp_path, ("a", "http://127.0.0.1:9/v1"))
    app = await started(config, clock)
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    app.config_path = str(path)
    try:
        old = app.generation
        # A request whose body never ends: it holds the old generation past any grace.
        headers = [(b"content-type", b"application/json"), *AUTH]
        held = Client(app, "POST", "/v1/chat/completions", [b"{"], False, headers)
        await turns()
        assert old.in_flight == 1
        reload = Client(app, "POST", "/admin/reload", [b""], headers=AUTH)
        await reload.done()
        assert (reload.status, reload.json()["generation"]) == (200, 2)
        assert app.reloader.retiring == 1
        with caplog.at_level(logging.WARNING, "ballast.admin"):
            clock.advance(5.9)
            await turns()
            assert app.reloader.retiring == 1 and caplog.records == []
            clock.advance(0.2)
            for _ in range(200):
                if app.reloader.retiring == 0:
                    break
                await turns(1)
        assert app.reloader.retiring == 0
        assert "1 requests still running after 6s" in caplog.records[0].getMessage()
        assert old.in_flight == 1 and not held.task.done()  # closed under it, not waited for
        held.leave()
        await held.done()
    finally:
        await app.shutdown()


async def test_a_swap_keeps_the_breaker_health_and_drain_of_an_unchanged_deployment(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    app = await started(tree(tmp_path, ("a", "http://127.0.0.1:9/v1")), clock)
    try:
        kept = app.router.targets["a"]
        kept.drained = True
        new = tree(tmp_path, ("a", "http://127.0.0.1:9/v1"), ("b", "http://127.0.0.1:10/v1"))
        await app.reloader.swap(parse_settings(new, environ={}))
        assert app.generation.number == 2 and app.reloader.reloads == 1
        assert app.observer.events[-1]["event"] == "reload"
        assert app.observer.events[-1]["ts"] == clock.time()  # stamped by the app's clock
        assert app.router is app.generation.router and app.pipeline.router is app.router
        a, b = app.router.targets["a"], app.router.targets["b"]
        assert a is not kept
        assert (a.breaker, a.health, a.drained) == (kept.breaker, kept.health, True)
        changed = tree(tmp_path, ("a", "http://127.0.0.1:11/v1"))
        await app.reloader.swap(parse_settings(changed, environ={}))
        fresh = app.router.targets["a"]
        assert fresh.breaker is not kept.breaker and fresh.drained is False
        assert b.id not in app.router.targets
    finally:
        await app.shutdown()


async def test_a_new_master_key_works_on_v1_and_the_old_one_stops_after_a_reload(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    config = tree(tmp_path, ("a", "http://127.0.0.1:9/v1"))
    app = await started(config, clock)

    async def status(key: str) -> int | None:
        headers = [(b"authorization", f"Bearer {key}".encode())]
        client = Client(app, "GET", "/v1/models", [b""], headers=headers)
        await client.done()
        return client.status

    try:
        assert await status(MASTER) == 200  # now remembered by its Authorization value
        new = MASTER + "-rotated"
        config["server"]["master_key"] = new
        await app.reloader.swap(parse_settings(config, environ={}))
        assert await status(MASTER) == 401
        assert await status(new) == 200
    finally:
        await app.shutdown()

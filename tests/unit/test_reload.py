"""Config reload, in process: a swap keeps what is known about unchanged deployments. The app
is driven through its ASGI callable (tests/unit/drive.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ballast.config import parse_settings
from ballast.resilience.clock import ManualClock
from tests.unit.drive import settings_tree, started

MASTER = "sk-master-reload"


def tree(tmp: Path, *deployments: tuple[str, str]) -> dict[str, Any]:
    config = settings_tree(tmp, "http://127.0.0.1:9/v1", master_key=MASTER, body_timeout=1000.0)
    config["timeouts"]["request"] = 1.0  # the grace of a retiring generation: 1 + 5 s
    config["models"][0]["deployments"] = [{"id": i, "url": url} for i, url in deployments]
    return config


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

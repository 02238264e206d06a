"""Deployments that speak their own wire are probed in their own wire, with their own
credential header: an Anthropic or Azure deployment whose breaker opened is back within a
second of its recovery, and a refused credential is checked with the deployment's key."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.e2e.test_recovery import PROBES, probes
from tests.e2e.test_routing import MESSAGES, client, config
from tests.stack import Stack, deployment, group


def native(provider: str, sim: Any) -> dict[str, Any]:
    if provider == "anthropic":
        return deployment("a", sim, model="claude-sim", provider="anthropic")
    return {
        "id": "a",
        "url": sim.url,
        "api_key": "az-a-key",
        "model": "gpt-4o",
        "provider": "azure",
        "azure": {"api_version": "2024-10-21"},
    }


def drive(api: openai.OpenAI, seconds: float, every: float = 0.1) -> list[tuple[float, str]]:
    """Streamed requests at a steady pace for `seconds`: (when, which deployment answered),
    read off the stream's x-ballast-deployment header (an Anthropic answer has no
    system_fingerprint to tell the simulators apart). Each request is a caller of its own,
    as a group's traffic is (see test_recovery.drive)."""
    served: list[tuple[float, str]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        raw = api.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES, stream=True, user=f"caller-{len(served)}"
        )
        served.append((started, raw.headers["x-ballast-deployment"]))
        list(raw.parse())
        time.sleep(max(0.0, every - (time.monotonic() - started)))
    return served


@pytest.mark.parametrize("provider", ["anthropic", "azure"])
def test_an_open_native_deployment_is_probed_back_within_a_second(
    stack: Stack, provider: str
) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    b = stack.sim("ok?tokens=4&latency=0.05", name="b")
    gateway = stack.gateway(
        config(group("chat", native(provider, a), deployment("b", b, model="m")), routing=PROBES)
    )
    api = client(gateway)
    drive(api, 0.5)
    stack.set_behaviour(a, "500")
    during = drive(api, 2.0)
    assert all(who != "a" for _, who in during[3:])
    outage_probes = probes(stack, a)
    assert outage_probes, "a was never probed"
    header = "x-api-key" if provider == "anthropic" else "api-key"
    assert all(p["headers"].get(header) for p in outage_probes)
    assert all("authorization" not in p["headers"] for p in outage_probes)
    stack.set_behaviour(a, "ok?tokens=4")
    recovered = time.monotonic()
    back = [when - recovered for when, who in drive(api, 2.0) if who == "a"]
    assert back and back[0] < 1.0, back

"""A recovered deployment is back in use within seconds, found by the gateway's own
background probes (not by gambling client requests), and only the upstream's own faults
count against it: a refusal a client provoked cools nothing down."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import openai
import pytest

from tests.e2e.test_routing import chat, client, config, served_by
from tests.stack import Stack, deployment, group, wait_for

PROBES = {"breaker": {"probe_interval": 0.3, "max_probe_interval": 0.6}}


def probes(stack: Stack, sim: Any) -> list[dict[str, Any]]:
    """The simulator's log of the gateway's probes (client requests carry a request id)."""
    return [e for e in stack.attempts(sim) if "x-request-id" not in e["headers"]]


def drive(api: openai.OpenAI, seconds: float, every: float = 0.1) -> list[tuple[float, str]]:
    """Requests at a steady pace for `seconds`: (when, which simulator answered). Each is a
    caller of its own (a conversation prompt-cache affinity keeps to its deployment), as a
    group's traffic is: one conversation alone would measure affinity, not recovery
    (tests/unit/routing/test_affinity.py holds a conversation across an outage)."""
    served: list[tuple[float, str]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        answer = chat(api, user=f"caller-{len(served)}")
        served.append((started, served_by(answer.system_fingerprint)))
        time.sleep(max(0.0, every - (time.monotonic() - started)))
    return served


def outage_then_recovery(stack: Stack, a: Any, api: openai.OpenAI) -> tuple[float, int]:
    """(seconds from a's recovery to the first request it answered, probes during outage)."""
    drive(api, 0.5)
    stack.set_behaviour(a, "503")
    during = drive(api, 2.0)
    assert all(who != "a" for _, who in during[3:])  # a's breaker opened at once
    probed = len(probes(stack, a))
    stack.set_behaviour(a, "ok?tokens=4")
    recovered = time.monotonic()
    after = drive(api, 2.0)
    back = [when - recovered for when, who in after if who == "a"]
    assert back, "a was never used again"
    return back[0], probed


def test_a_recovered_deployment_of_a_group_is_back_within_a_second(stack: Stack) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    b = stack.sim("ok?tokens=4&latency=0.05", name="b")  # the slower of the two
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a, model="m"), deployment("b", b, model="m")),
            routing=PROBES,
        )
    )
    back, probed = outage_then_recovery(stack, a, client(gateway))
    assert back < 1.0, back
    assert 1 <= probed <= 2.0 / 0.3 + 1  # at most one probe per interval, outage included
    # Once back and faster, it has most of the traffic again.
    served = drive(client(gateway), 1.0)
    assert sum(who == "a" for _, who in served) >= 0.6 * len(served)
    # Probe traffic is on /metrics, by outcome.
    with urllib.request.urlopen(gateway.url + "/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert 'ballast_probes_total{deployment="a",outcome="failed"}' in metrics
    assert 'ballast_probes_total{deployment="a",outcome="ok"} 1.0' in metrics


def test_a_recovered_primary_model_is_back_from_its_fallback_within_a_second(
    stack: Stack,
) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    b = stack.sim("ok?tokens=4", name="b")
    gateway = stack.gateway(
        config(
            group("chat", deployment("a", a, model="m"), fallbacks=["backup"]),
            group("backup", deployment("b", b, model="m")),
            routing=PROBES,
        )
    )
    back, probed = outage_then_recovery(stack, a, client(gateway))
    assert back < 1.0, back
    assert probed <= 2.0 / 0.3 + 1


def test_a_refusal_a_client_provoked_cools_nothing_down(stack: Stack) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    stack.set_behaviour(a, "401", model="forbidden")  # this upstream key may not use it
    gateway = stack.gateway(config(group("*", deployment("a", a)), routing=PROBES))
    api = client(gateway)
    for _ in range(6):
        try:
            chat(api, model="forbidden")
        except openai.APIStatusError as error:
            assert error.status_code in (401, 502)
        assert chat(api, model="allowed").choices[0].message.content == "tok0 tok1 tok2 tok3 "
    breaker = gateway.router.targets["a"].breaker
    assert breaker.state.value == "closed"
    assert probes(stack, a) == []  # the model list answered: the key itself is fine


def test_a_refused_key_is_cooled_down_after_the_probe_confirms_it(stack: Stack) -> None:
    a = stack.sim("401", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a)), routing=PROBES))
    api = client(gateway)
    with pytest.raises(openai.APIStatusError):
        chat(api)
    breaker = gateway.router.targets["a"].breaker
    wait_for(lambda: breaker.state.value == "open")

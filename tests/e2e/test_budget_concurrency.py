"""Budgets hold under concurrency: each request reserves its worst-case cost before it goes
upstream, in a ledger every worker and instance shares, and settles with the real cost.
Here on the embedded SQLite, in one process and with two workers (Redis and PostgreSQL:
tests/integration/test_budget_shared.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.sim.server import SimServer
from tests.e2e.test_access import MASTER, new_key
from tests.e2e.test_workers import workers
from tests.stack import Gateway, Stack, deployment, free_port, group, serve, sqlite_state, wait_for

# Only output is priced, $1 a token: a request with max_tokens N reserves exactly $N.
PRICES = {"sim-chat": {"input": 0.0, "output": 1_000_000.0}}
ANSWER_TOKENS = 5
# The simulator of the budget tests: answers of ANSWER_TOKENS tokens, 0.3 s each.
SLOW_SIM = pytest.mark.sim(default=f"ok?tokens={ANSWER_TOKENS}&latency=0.3")
pytestmark = SLOW_SIM


def config(sim: SimServer, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "server": {"master_key": MASTER},
        "state": state,
        "prices": PRICES,
        "models": [group("chat", deployment("a", sim, model="sim-chat"))],
    }


def ask(url: str, key: str, max_tokens: int) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps({**body, "max_tokens": max_tokens}).encode(),
        method="POST",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status  # type: ignore[no-any-return]
    except urllib.error.HTTPError as error:
        code = json.loads(error.read())["error"]["code"]
        assert error.code != 429 or code == "insufficient_quota", code
        return error.code


def burst(urls: list[str], key: str, count: int = 50) -> list[int]:
    """`count` requests at once, spread over `urls`, each reserving one answer's cost."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda i: ask(urls[i % len(urls)], key, ANSWER_TOKENS), range(count)))


def settled_spend(gw_url: str, key_id: str, expected_at_least: float) -> float:
    """The key's spend once its answers are flushed."""
    spend = 0.0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, body = admin_at(gw_url, f"/admin/keys/spend?id={key_id}")
        spend = body["spend"] if status == 200 else spend
        if spend >= expected_at_least:
            break
        time.sleep(0.1)
    return float(spend)


def admin_at(url: str, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(url + path, headers={"authorization": f"Bearer {MASTER}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def check_three_answers(
    stack: Stack, sim: SimServer, urls: list[str], key: str, key_id: str
) -> None:
    stack.clear_log(sim)
    statuses = burst(urls, key)
    answered = statuses.count(200)
    assert answered == 3, statuses
    assert len(stack.attempts(sim)) == 3  # the simulator's own count of upstream calls
    spend = settled_spend(urls[0], key_id, 3 * ANSWER_TOKENS)
    assert 3 * ANSWER_TOKENS <= spend <= 3 * ANSWER_TOKENS + ANSWER_TOKENS


def test_fifty_at_once_on_a_three_answer_budget_get_three_answers(
    stack: Stack, sim: SimServer, tmp_path: Path
) -> None:
    gateway = stack.gateway(config(sim, sqlite_state(tmp_path, spend_flush_interval=0.1)))
    key, key_id = new_key(gateway, budget=3.0 * ANSWER_TOKENS, budget_period="total")
    check_three_answers(stack, sim, [gateway.url], key, key_id)


def test_a_budget_with_room_left_is_not_refused_for_what_requests_gave_back(
    stack: Stack, sim: SimServer, tmp_path: Path
) -> None:
    gateway: Gateway = stack.gateway(config(sim, sqlite_state(tmp_path, spend_flush_interval=0.1)))
    # Each request reserves 10 and costs 5: the rest comes back when it is answered.
    key, _ = new_key(gateway, budget=20.0, budget_period="total")
    statuses = [ask(gateway.url, key, 2 * ANSWER_TOKENS) for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    # Reservations of a request that ended without an answer come back too.
    stack.set_behaviour(sim, "context_length")
    other, _ = new_key(gateway, budget=10.0, budget_period="total")
    assert [ask(gateway.url, other, 2 * ANSWER_TOKENS) for _ in range(3)] == [400] * 3
    stack.set_behaviour(sim, f"ok?tokens={ANSWER_TOKENS}")
    assert ask(gateway.url, other, 2 * ANSWER_TOKENS) == 200


def test_two_workers_share_one_budget(stack: Stack, sim: SimServer, tmp_path: Path) -> None:
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config(sim, sqlite_state(tmp_path, spend_flush_interval=0.1))))
    port = free_port()
    process = serve(path, port, workers=2, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(workers(process.pid)) == 2, timeout=30)
        wait_for(lambda: admin_at(url, "/health")[0] == 200, timeout=30)
        request = urllib.request.Request(
            url + "/admin/keys",
            data=json.dumps(
                {"name": "w", "budget": 3.0 * ANSWER_TOKENS, "budget_period": "total"}
            ).encode(),
            method="POST",
            headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            created = json.loads(response.read())
        check_three_answers(stack, sim, [url], created["key"], created["id"])
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr, stderr.decode()[-2000:]

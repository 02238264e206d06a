"""The jobs API through a real gateway against the simulator's RunPod-compatible backend,
with short real durations: submit, long-poll, list, cancel, key isolation, slots, a full
held queue and the errors a client sees."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ballast.sim.jobs import SIM_JOBS, JobsSim
from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group, sqlite_state

MASTER = "sk-master-for-jobs-tests-0123456789"


def call(
    gw: Gateway,
    method: str,
    path: str,
    body: Any = None,
    key: str = MASTER,
    raw: bytes | None = None,
) -> tuple[int, Any, dict[str, str]]:
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        gw.url + path,
        data=data,
        method=method,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def start(stack: Stack, tmp_path: Path, **backend: Any) -> tuple[Gateway, SimServer, JobsSim]:
    sim = stack.sim()
    options: dict[str, Any] = {
        "protocol": "runpod",
        "url": sim.url,
        "poll_interval": 0.05,
        "max_poll_interval": 0.1,
        "request_timeout": 2.0,
        "typical_duration": 1.0,
    }
    options.update(backend)
    gateway = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "state": sqlite_state(tmp_path),
            "jobs": {"backends": {"gpu": options}, "claim_interval": 0.05},
            "models": [group("chat", deployment("a", sim))],
        }
    )
    return gateway, sim, sim.app[SIM_JOBS]


def new_key(gw: Gateway, **options: Any) -> str:
    status, body, _ = call(gw, "POST", "/admin/keys", {"name": "jobs", **options})
    assert status == 201, body
    key: str = body["key"]
    return key


def test_submit_long_poll_and_list_own_jobs_only(stack: Stack, tmp_path: Path) -> None:
    gateway, _, remote = start(stack, tmp_path)
    alice, bob = new_key(gateway), new_key(gateway)
    status, job, _ = call(
        gateway, "POST", "/v1/jobs", {"backend": "gpu", "input": {"prompt": "a cat"}}, alice
    )
    assert status == 202 and job["status"] == "queued" and job["id"].startswith("job_")
    started = time.monotonic()
    status, done, _ = call(gateway, "GET", f"/v1/jobs/{job['id']}?wait=10", key=alice)
    assert status == 200 and time.monotonic() - started < 8
    assert done["status"] == "succeeded" and done["progress"] == 1.0
    assert done["output"] == {"echo": {"prompt": "a cat"}} and done["error"] is None
    assert len(remote.calls("run")) == 1
    status, listed, _ = call(gateway, "GET", "/v1/jobs", key=alice)
    assert [j["id"] for j in listed["data"]] == [job["id"]]
    assert call(gateway, "GET", "/v1/jobs", key=bob)[1]["data"] == []
    status, hidden, _ = call(gateway, "GET", f"/v1/jobs/{job['id']}", key=bob)
    assert status == 404 and hidden["error"]["code"] == "job_not_found"
    status, refused, _ = call(gateway, "POST", f"/v1/jobs/{job['id']}/cancel", key=bob)
    assert status == 404 and refused["error"]["code"] == "job_not_found"


def test_wait_returns_the_current_state_when_time_is_up(stack: Stack, tmp_path: Path) -> None:
    gateway, _, _ = start(stack, tmp_path)
    body = {"backend": "gpu", "input": {"sim": {"duration": 30}}}
    job = call(gateway, "POST", "/v1/jobs", body)[1]
    started = time.monotonic()
    status, seen, _ = call(gateway, "GET", f"/v1/jobs/{job['id']}?wait=0.5")
    assert status == 200 and seen["status"] in ("queued", "running")
    assert 0.4 < time.monotonic() - started < 5


def test_cancel_is_cancelling_until_the_backend_confirms(stack: Stack, tmp_path: Path) -> None:
    gateway, _, remote = start(stack, tmp_path)
    remote.cancel_delay = 0.5
    job = call(gateway, "POST", "/v1/jobs", {"backend": "gpu", "input": {"sim": {"duration": 30}}})[
        1
    ]
    deadline = time.monotonic() + 5
    while call(gateway, "GET", f"/v1/jobs/{job['id']}")[1]["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    status, cancelling, _ = call(gateway, "POST", f"/v1/jobs/{job['id']}/cancel")
    assert status == 200 and cancelling["status"] == "cancelling"
    status, done, _ = call(gateway, "GET", f"/v1/jobs/{job['id']}?wait=5")
    assert done["status"] == "cancelled"
    assert remote.calls("cancel")


def test_slots_and_a_full_held_queue_are_refused_clearly(stack: Stack, tmp_path: Path) -> None:
    gateway, _, remote = start(
        stack,
        tmp_path,
        max_queued=1,
        breaker={"failure_threshold": 1, "open_time": 60, "probe_timeout": 60},
    )
    remote.run_failures = 1  # the first submission fails: the breaker opens, jobs are held
    key = new_key(gateway, max_concurrent_jobs=2)
    body = {"backend": "gpu", "input": {}}
    held = call(gateway, "POST", "/v1/jobs", body, key)
    assert held[0] == 202
    deadline = time.monotonic() + 5
    while not remote.calls("run"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.1)
    status, full, headers = call(gateway, "POST", "/v1/jobs", body, key)
    assert status == 503 and full["error"]["code"] == "jobs_queue_full"
    assert int(headers["retry-after"]) >= 1
    other = call(gateway, "POST", "/v1/jobs", body)  # the master key, no slot limit
    assert other[0] == 503
    assert call(gateway, "GET", f"/v1/jobs/{held[1]['id']}", key=key)[1]["status"] == "queued"
    assert call(gateway, "POST", f"/v1/jobs/{held[1]['id']}/cancel", key=key)[0] == 200
    second_key = new_key(gateway, max_concurrent_jobs=1)
    stack_job = call(gateway, "POST", "/v1/jobs", body, second_key)
    assert stack_job[0] == 202
    status, limited, _ = call(gateway, "POST", "/v1/jobs", body, second_key)
    assert status == 429 and limited["error"]["code"] == "concurrent_jobs_exceeded"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/v1/jobs", {"backend": "nope", "input": {}}, 404, "backend_not_found"),
        ("POST", "/v1/jobs", {"input": {}}, 400, "invalid_request"),
        ("POST", "/v1/jobs", {"backend": "gpu"}, 400, "invalid_request"),
        ("GET", "/v1/jobs/job_missing", None, 404, "job_not_found"),
        ("GET", "/v1/jobs/job_missing?wait=abc", None, 400, "invalid_request"),
        ("DELETE", "/v1/jobs", None, 405, None),
    ],
)
def test_errors_are_openai_shaped(
    stack: Stack, tmp_path: Path, method: str, path: str, body: Any, status: int, code: str | None
) -> None:
    gateway, _, _ = start(stack, tmp_path)
    got, error, _ = call(gateway, method, path, body)
    assert got == status and error["error"]["code"] == code
    assert set(error["error"]) == {"message", "type", "param", "code"}


def test_bad_json_and_missing_key(stack: Stack, tmp_path: Path) -> None:
    gateway, _, _ = start(stack, tmp_path)
    status, error, _ = call(gateway, "POST", "/v1/jobs", raw=b"{nope")
    assert status == 400 and error["error"]["type"] == "invalid_request_error"
    status, error, _ = call(gateway, "GET", "/v1/jobs", key="sk-bl-unknown")
    assert status == 401 and error["error"]["code"] == "invalid_api_key"


def test_a_restarted_gateway_resumes_the_job_without_resubmitting(
    stack: Stack, tmp_path: Path
) -> None:
    first, _, remote = start(stack, tmp_path)
    body = {"backend": "gpu", "input": {"sim": {"duration": 1.5}}}
    job = call(first, "POST", "/v1/jobs", body)[1]
    deadline = time.monotonic() + 5
    while call(first, "GET", f"/v1/jobs/{job['id']}")[1]["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)

    async def stop() -> None:
        first.server.should_exit = True
        await first.task

    stack.thread.run(stop())  # a clean shutdown hands the job's lease back
    config = first.app.settings
    second = stack.gateway(config)
    status, done, _ = call(second, "GET", f"/v1/jobs/{job['id']}?wait=10")
    assert status == 200 and done["status"] == "succeeded"
    assert len(remote.calls("run")) == 1
    pollers = {c["instance"] for c in remote.calls("status")}
    assert len(pollers) == 2, "polled first by one gateway, then by the other"


def test_a_job_passes_the_keys_model_list_rate_limit_and_budget(
    stack: Stack, tmp_path: Path
) -> None:
    gateway, _, _ = start(stack, tmp_path)
    job = {"backend": "gpu", "input": {"prompt": "a cat"}}
    # A key restricted to a model may not use a backend its list does not name.
    chat_only = new_key(gateway, models=["chat"])
    status, body, _ = call(gateway, "POST", "/v1/jobs", job, chat_only)
    assert status == 403 and body["error"]["param"] == "backend", body
    assert call(gateway, "POST", "/v1/jobs", job, new_key(gateway, models=["gpu"]))[0] == 202
    # A key whose requests a minute are used up (here by a chat request) submits none.
    one_a_minute = new_key(gateway, rpm=1)
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    assert call(gateway, "POST", "/v1/chat/completions", chat, one_a_minute)[0] == 200
    status, body, _ = call(gateway, "POST", "/v1/jobs", job, one_a_minute)
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    # A key whose budget is used up submits none.
    spent = new_key(gateway, budget=0.0, budget_period="total")
    status, body, _ = call(gateway, "POST", "/v1/jobs", job, spent)
    assert status == 429 and body["error"]["code"] == "insufficient_quota", body
    assert call(gateway, "POST", "/v1/jobs", job, new_key(gateway, budget=1.0))[0] == 202

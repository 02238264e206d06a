"""Each protocol's statuses map onto one local state machine; an unknown word is alive, never
terminal; the execution timeout goes down to the remote the way each protocol allows."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from ballast.config import JobBackendSettings
from ballast.jobs.backends import build
from ballast.jobs.backends.base import NotFound, RateLimited, Rejected, Unreachable
from ballast.jobs.backends.replicate import parse as replicate
from ballast.jobs.backends.runpod import parse as runpod
from ballast.jobs.progress import estimate


@pytest.mark.parametrize(
    ("word", "state"),
    [
        ("IN_QUEUE", "queued"),
        ("IN_PROGRESS", "running"),
        ("COMPLETED", "succeeded"),
        ("FAILED", "failed"),
        ("CANCELLED", "cancelled"),
        ("TIMED_OUT", "failed"),
        ("THROTTLED", "alive"),
        ("", "alive"),
    ],
)
def test_runpod_statuses(word: str, state: str) -> None:
    assert runpod({"id": "r1", "status": word}).state == state


@pytest.mark.parametrize(
    ("word", "state"),
    [
        ("starting", "queued"),
        ("processing", "running"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("canceled", "cancelled"),
        ("aborted", "failed"),
        ("booting", "alive"),
    ],
)
def test_replicate_statuses(word: str, state: str) -> None:
    assert replicate({"id": "p1", "status": word}).state == state


def test_remote_reasons_progress_and_outputs_are_read() -> None:
    timed_out = runpod({"id": "r", "status": "TIMED_OUT", "error": "600s"})
    assert timed_out.error == "The backend timed the job out: 600s"
    assert runpod({"id": "r", "status": "FAILED", "error": "OOM"}).error == "OOM"
    assert runpod({"id": "r", "status": "IN_PROGRESS", "output": {"progress": 40}}).progress == 0.4
    assert runpod({"id": "r", "status": "COMPLETED", "output": [1]}).output == [1]
    logs = "step 1\n 37%|###      | 37/100"
    assert replicate({"id": "p", "status": "processing", "logs": logs}).progress == 0.37
    assert replicate({"id": "p", "status": "aborted"}).error is not None


def test_progress_estimate_is_capped_until_success() -> None:
    assert estimate(None, "running", 0.0, 50.0, 100.0) == 0.5
    assert estimate(None, "running", 0.0, 5000.0, 100.0) == 0.98
    assert estimate(1.0, "running", 0.0, 1.0, 100.0) == 0.98
    assert estimate(None, "queued", 0.0, 500.0, 100.0) == 0.0
    assert estimate(None, "running", 0.0, 10.0, 100.0, previous=0.3) == 0.3  # never backwards
    assert estimate(None, "succeeded", 0.0, 1.0, 100.0) == 1.0


@pytest.fixture
async def remote() -> AsyncIterator[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    script: dict[str, Any] = {"status": 200, "body": {"id": "x1", "status": "starting"}}

    async def anything(request: web.Request) -> web.Response:
        raw = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.path,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": orjson.loads(raw) if raw else None,
            }
        )
        return web.json_response(script["body"], status=script["status"])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", seen, script
    await runner.cleanup()


async def test_replicate_sends_cancel_after_and_reads_predictions(remote: Any) -> None:
    url, seen, script = remote
    settings = JobBackendSettings(protocol="replicate", url=url, api_key="r8-key")
    backend = build("rep", settings, "inst-1")
    try:
        submitted = await backend.submit("job_1", {"prompt": "p"})
        assert submitted.remote_id == "x1" and submitted.state == "queued"
        assert seen[0]["path"] == "/predictions" and seen[0]["body"] == {"input": {"prompt": "p"}}
        assert seen[0]["headers"]["cancel-after"] == "600s"
        assert seen[0]["headers"]["authorization"] == "Bearer r8-key"
        script["body"] = {"id": "x1", "status": "succeeded", "output": ["a.png"]}
        done = await backend.status("x1")
        assert done.state == "succeeded" and done.output == ["a.png"]
        assert seen[1]["path"] == "/predictions/x1"
        await backend.cancel("x1")
        assert seen[2]["method"] == "POST" and seen[2]["path"] == "/predictions/x1/cancel"
    finally:
        await backend.close()


async def test_generic_http_backend_uses_its_status_map_and_paths(remote: Any) -> None:
    url, seen, script = remote
    settings = JobBackendSettings(
        protocol="http",
        url=url,
        submit_path="/api/tasks",
        status_path="/api/tasks/{id}",
        status_map={"WAITING": "queued", "BUSY": "running", "DONE": "succeeded"},
        execution_timeout=900,
    )
    backend = build("generic", settings)
    try:
        script["body"] = {"id": "t9", "status": "WAITING"}
        assert (await backend.submit("job_1", [1, 2])).state == "queued"
        assert seen[0]["body"] == {"input": [1, 2], "execution_timeout": 900.0}
        script["body"] = {"id": "t9", "status": "BUSY", "progress": 0.25}
        busy = await backend.status("t9")
        assert busy.state == "running" and busy.progress == 0.25
        assert seen[1]["path"] == "/api/tasks/t9"
        script["body"] = {"id": "t9", "status": "MIGRATING"}
        assert (await backend.status("t9")).state == "alive"
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("status", "error"),
    [(429, RateLimited), (404, NotFound), (503, Unreachable), (500, Unreachable), (400, Rejected)],
)
async def test_http_answers_become_one_kind_of_outcome(
    remote: Any, status: int, error: type[Exception]
) -> None:
    url, _, script = remote
    script["status"] = status
    backend = build("rp", JobBackendSettings(protocol="runpod", url=url))
    try:
        with pytest.raises(error):
            await backend.status("r1")
    finally:
        await backend.close()


async def test_an_unreachable_backend_is_no_answer_not_a_verdict() -> None:
    backend = build(
        "rp", JobBackendSettings(protocol="runpod", url="http://127.0.0.1:9", request_timeout=1)
    )
    try:
        with pytest.raises(Unreachable) as refused:
            await backend.submit("job_1", {})
        assert refused.value.maybe_sent is False  # refused connection: certainly not submitted
    finally:
        await backend.close()


def test_jobs_config_is_validated_and_its_secrets_masked() -> None:
    from ballast.config import ConfigError, masked, parse_settings

    base: dict[str, Any] = {
        "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://127.0.0.1:1"}]}]
    }
    settings = parse_settings(
        {
            **base,
            "jobs": {
                "backends": {
                    "gpu": {
                        "protocol": "runpod",
                        "url": "http://127.0.0.1:2/v2/e/",
                        "api_key": "s3",
                    }
                }
            },
        },
        environ={},
    )
    gpu = settings.jobs.backends["gpu"]
    assert gpu.url == "http://127.0.0.1:2/v2/e" and gpu.lost_contact_timeout == 600.0
    assert masked(settings)["jobs"]["backends"]["gpu"]["api_key"] == "****"
    with pytest.raises(ConfigError) as bad:
        parse_settings(
            {**base, "jobs": {"backends": {"gpu": {"protocol": "modal", "url": "http://x"}}}},
            environ={},
        )
    assert any(line.startswith("jobs.backends.gpu.protocol") for line in bad.value.errors)


def test_a_gateway_loads_aiohttp_only_when_a_job_backend_sends() -> None:
    """aiohttp is about 8 MB of a worker's memory, and most gateways run no jobs."""
    script = (
        "import asyncio, sys, ballast.cli, ballast.app, ballast.server.serving\n"
        "from ballast.config import JobBackendSettings\n"
        "from ballast.jobs.backends import build\n"
        "settings = JobBackendSettings(protocol='runpod', url='http://127.0.0.1:9')\n"
        "backend = build('rp', settings, '')\n"
        "print('aiohttp' in sys.modules)\n"
        "async def send():\n"
        "    backend.session()\n"
        "    await backend.close()\n"
        "asyncio.run(send())\n"
        "print('aiohttp' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "True"]

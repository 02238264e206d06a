"""The reference sampling actor over real loopback HTTP, in front of the simulator.

Idle reclaim and token expiry run on a ManualClock, so a 15-minute window takes no time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import jwt
import pytest
import typer

import ballast.actor.cli as actor_cli
import ballast.actor.server as actor_server
from ballast.actor.runs import Ended, Run
from ballast.actor.server import ActorServer, start_actor
from ballast.actor.tokens import TokenIssuer
from ballast.resilience.clock import ManualClock
from ballast.sim.server import SimServer

CONTROL = "control-secret-for-tests-0123456789"
JWT_SECRET = "jwt-secret-for-tests-0123456789abcdef"
IDLE = 900.0
TTL = 3600.0
MODEL = "sim-model"
CHAT = "/v1/chat/completions"
INACTIVE = {
    "error": {
        "code": "sampling_run_inactive",
        "type": "invalid_request_error",
        "message": "sampling run is not active",
        "param": None,
    }
}

pytestmark = pytest.mark.sim(name="backend")

MakeActor = Callable[..., Awaitable[ActorServer]]


@pytest.fixture
async def make_actor(sim: SimServer, clock: ManualClock) -> AsyncIterator[MakeActor]:
    started: list[ActorServer] = []

    async def make(backend: str | None = None, **options: Any) -> ActorServer:
        options.setdefault("idle_timeout", IDLE)
        options.setdefault("jwt_ttl", TTL)
        actor = await start_actor(
            backend or sim.url,
            "127.0.0.1",
            0,
            control_secret=CONTROL,
            jwt_secret=JWT_SECRET,
            clock=clock,
            **options,
        )
        started.append(actor)
        return actor

    try:
        yield make
    finally:
        for actor in started:
            await actor.close()


@pytest.fixture
async def actor(make_actor: MakeActor) -> ActorServer:
    return await make_actor()


def control(secret: str = CONTROL) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def create_run(
    http: aiohttp.ClientSession, actor: ActorServer, session_id: str = "sess-1"
) -> dict[str, Any]:
    async with http.post(
        actor.url + "/runs", json={"model": MODEL, "session_id": session_id}, headers=control()
    ) as resp:
        assert resp.status == 201, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


def chat_body(stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}]}
    if stream:
        body["stream"] = True
    return body


async def call(
    http: aiohttp.ClientSession,
    actor: ActorServer,
    run: dict[str, Any],
    *,
    path: str = CHAT,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, aiohttp.ClientResponse]:
    sent = {"Authorization": f"Bearer {run['token'] if token is None else token}"}
    sent.update(headers or {})
    async with http.post(
        f"{actor.url}/runs/{run['run_id']}{path}", json=body or chat_body(), headers=sent
    ) as resp:
        return resp.status, await resp.read(), resp


async def stats(
    http: aiohttp.ClientSession, actor: ActorServer, path: str = "/metrics/runs"
) -> Any:
    async with http.get(actor.url + path) as resp:
        assert resp.status == 200
        return await resp.json()


async def sim_attempts(http: aiohttp.ClientSession, sim: SimServer) -> list[dict[str, Any]]:
    async with http.get(sim.url + "/sim/log") as resp:
        result: list[dict[str, Any]] = (await resp.json())["attempts"]
        return result


def assert_error(raw: bytes, code: str | None) -> dict[str, Any]:
    body = json.loads(raw)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def sse_events(raw: bytes) -> list[Any]:
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def poll(condition: Callable[[], bool], seconds: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# -- runs ----------------------------------------------------------------------------------


async def test_create_run_returns_a_signed_token_for_the_run(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    run = await create_run(http, actor, "sess-42")
    assert set(run) == {"run_id", "token", "expires_at"}
    assert run["expires_at"] == int(clock.time() + TTL)
    claims = jwt.decode(
        run["token"], JWT_SECRET, algorithms=["HS256"], options={"verify_exp": False}
    )
    assert claims["sub"] == run["run_id"]
    assert claims["exp"] == run["expires_at"]
    assert claims["session_id"] == "sess-42"
    assert claims["model"] == MODEL
    other = await create_run(http, actor, "sess-42")
    assert other["run_id"] != run["run_id"]
    assert await stats(http, actor) == {"created": 2, "reclaimed": 0, "deleted": 0, "active": 2}


@pytest.mark.parametrize(
    "headers",
    [{}, control("wrong-secret"), control(CONTROL + "x"), {"Authorization": CONTROL}],
    ids=["missing", "wrong", "longer", "no-scheme"],
)
async def test_bad_control_secret_is_401_and_creates_nothing(
    actor: ActorServer, http: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    async with http.post(
        actor.url + "/runs", json={"model": MODEL, "session_id": "s"}, headers=headers
    ) as resp:
        assert resp.status == 401
        assert_error(await resp.read(), "invalid_api_key")
    assert (await stats(http, actor))["created"] == 0


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", "invalid_json", None),
        (b"[]", "invalid_body", None),
        (b'{"session_id": "s"}', "invalid_value", "model"),
        (b'{"model": "", "session_id": "s"}', "invalid_value", "model"),
        (b'{"model": "m"}', "invalid_value", "session_id"),
        (b'{"model": "m", "session_id": 5}', "invalid_value", "session_id"),
    ],
)
async def test_invalid_create_body_is_400(
    actor: ActorServer,
    http: aiohttp.ClientSession,
    body: bytes,
    code: str,
    param: str | None,
) -> None:
    async with http.post(actor.url + "/runs", data=body, headers=control()) as resp:
        assert resp.status == 400
        error = assert_error(await resp.read(), code)
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
    assert (await stats(http, actor))["created"] == 0


# -- proxying ------------------------------------------------------------------------------


async def test_non_stream_chat_is_proxied_without_the_run_token(
    actor: ActorServer, sim: SimServer, http: aiohttp.ClientSession
) -> None:
    run = await create_run(http, actor)
    status, raw, resp = await call(http, actor, run)
    assert status == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.headers["x-sim-name"] == "backend"  # backend headers pass through
    body = json.loads(raw)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 "
    [attempt] = await sim_attempts(http, sim)
    assert attempt["path"] == CHAT
    assert "authorization" not in attempt["headers"]


async def test_completions_endpoint_is_proxied(
    actor: ActorServer, sim: SimServer, http: aiohttp.ClientSession
) -> None:
    run = await create_run(http, actor)
    body = {"model": MODEL, "prompt": "say something"}
    status, raw, _ = await call(http, actor, run, path="/v1/completions", body=body)
    assert status == 200
    assert json.loads(raw)["object"] == "text_completion"
    assert [a["path"] for a in await sim_attempts(http, sim)] == ["/v1/completions"]


async def test_streaming_chat_is_relayed_as_sse(
    actor: ActorServer, http: aiohttp.ClientSession
) -> None:
    run = await create_run(http, actor)
    status, raw, resp = await call(http, actor, run, body=chat_body(stream=True))
    assert status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == "tok0 tok1 tok2 tok3 "


async def test_stream_chunks_arrive_while_the_backend_is_still_answering_and_keep_the_run(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    run = await create_run(http, actor)
    # The backend sends the role and one token, then stalls for a minute.
    headers = {
        "Authorization": f"Bearer {run['token']}",
        "x-sim-behaviour": "stall?after=1&seconds=60",
    }
    url = f"{actor.url}/runs/{run['run_id']}{CHAT}"
    resp = await http.post(url, json=chat_body(stream=True), headers=headers)
    try:
        assert resp.status == 200
        received = b""
        while received.count(b"data: ") < 2:
            received += await asyncio.wait_for(resp.content.readany(), 3.0)
        assert b"tok0" in received
        # Long past the idle timeout, but a request is in flight: the run stays.
        clock.advance(IDLE * 5)
        assert actor.registry.sweep() == 0
        found = actor.registry.get(run["run_id"])
        assert isinstance(found, Run) and found.in_flight == 1
    finally:
        resp.close()
    # The client left: the request ends, and the idle time counts from then.
    await poll(lambda: found.in_flight == 0)
    clock.advance(IDLE - 1)
    assert actor.registry.sweep() == 0
    clock.advance(2)
    assert actor.registry.sweep() == 1


@pytest.mark.parametrize("code", ["conflict", "sampling_run_inactive"])
async def test_backend_409_passes_through_unchanged(
    actor: ActorServer, sim: SimServer, http: aiohttp.ClientSession, code: str
) -> None:
    headers = {"x-sim-behaviour": f"409?code={code}"}
    async with http.post(sim.url + CHAT, json=chat_body(), headers=headers) as direct:
        assert direct.status == 409
        expected = await direct.read()
    run = await create_run(http, actor)
    status, raw, resp = await call(http, actor, run, headers=headers)
    assert status == 409
    assert raw == expected
    assert json.loads(raw)["error"]["code"] == code
    assert resp.headers["Content-Type"].startswith("application/json")
    # The actor's own run is untouched by the backend's answer.
    assert isinstance(actor.registry.get(run["run_id"]), Run)
    status, _, _ = await call(http, actor, run)
    assert status == 200


async def test_backend_api_key_replaces_the_run_token(
    make_actor: MakeActor, sim: SimServer, http: aiohttp.ClientSession
) -> None:
    actor = await make_actor(sim.url + "/v1/", backend_api_key="sk-backend-9876")
    run = await create_run(http, actor)
    status, _, _ = await call(http, actor, run)
    assert status == 200
    [attempt] = await sim_attempts(http, sim)
    assert attempt["path"] == CHAT
    assert attempt["headers"]["authorization"] == "***9876"


async def test_unreachable_backend_is_502(
    make_actor: MakeActor, http: aiohttp.ClientSession
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    actor = await make_actor(f"http://127.0.0.1:{port}")
    run = await create_run(http, actor)
    status, raw, _ = await call(http, actor, run)
    assert status == 502
    assert assert_error(raw, "backend_unavailable")["type"] == "api_error"
    assert isinstance(actor.registry.get(run["run_id"]), Run)


# -- tokens --------------------------------------------------------------------------------


async def test_bad_tokens_are_401_invalid_token(
    actor: ActorServer, sim: SimServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    run = await create_run(http, actor)
    other = await create_run(http, actor)
    forged = TokenIssuer("another-secret-0123456789abcdefgh", TTL, clock).issue(
        run["run_id"], "sess-1", MODEL
    )
    for token in ("garbage", forged.token, other["token"], run["token"] + "x"):
        status, raw, resp = await call(http, actor, run, token=token)
        assert status == 401, token
        assert_error(raw, "invalid_token")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    async with http.post(f"{actor.url}/runs/{run['run_id']}{CHAT}", json=chat_body()) as resp:
        assert resp.status == 401
        assert_error(await resp.read(), "invalid_token")
    assert await sim_attempts(http, sim) == []


async def test_expired_token_is_401_token_expired_and_a_fresh_one_works(
    make_actor: MakeActor, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    actor = await make_actor(jwt_ttl=60.0)
    run = await create_run(http, actor)
    clock.advance(59)
    status, _, _ = await call(http, actor, run)
    assert status == 200
    clock.advance(1)
    status, raw, _ = await call(http, actor, run)
    assert status == 401
    assert_error(raw, "token_expired")
    async with http.post(f"{actor.url}/runs/{run['run_id']}/token", headers=control()) as resp:
        assert resp.status == 200
        fresh = await resp.json()
    assert fresh["run_id"] == run["run_id"]
    assert fresh["expires_at"] == int(clock.time() + 60)
    status, _, _ = await call(http, actor, run, token=fresh["token"])
    assert status == 200


async def test_unknown_run_is_404_run_not_found(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    issued = TokenIssuer(JWT_SECRET, TTL, clock).issue("run_unknown", "sess-1", MODEL)
    run = {"run_id": "run_unknown", "token": issued.token}
    status, raw, _ = await call(http, actor, run)
    assert status == 404
    assert_error(raw, "run_not_found")
    async with http.post(f"{actor.url}/runs/run_unknown/token", headers=control()) as resp:
        assert resp.status == 404
        assert_error(await resp.read(), "run_not_found")


# -- idle reclaim --------------------------------------------------------------------------


async def test_idle_run_is_reclaimed_and_answers_409_sampling_run_inactive(
    actor: ActorServer, sim: SimServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    run = await create_run(http, actor)
    clock.advance(IDLE + 1)
    status, raw, resp = await call(http, actor, run)
    assert status == 409
    assert json.loads(raw) == INACTIVE
    assert resp.headers["Content-Type"].startswith("application/json")
    assert await sim_attempts(http, sim) == []  # nothing reached the backend
    assert await stats(http, actor) == {"created": 1, "reclaimed": 1, "deleted": 0, "active": 0}
    # Remembered: still 409 (not 404), and counted once.
    status, raw, _ = await call(http, actor, run)
    assert (status, json.loads(raw)) == (409, INACTIVE)
    assert (await stats(http, actor))["reclaimed"] == 1


async def test_activity_keeps_a_run_alive(
    make_actor: MakeActor, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    actor = await make_actor(jwt_ttl=IDLE * 10)
    run = await create_run(http, actor)
    clock.advance(IDLE)  # exactly the timeout is not longer than it
    for _ in range(4):
        status, _, _ = await call(http, actor, run)
        assert status == 200
        clock.advance(IDLE * 2 / 3)
        assert actor.registry.sweep() == 0
    clock.advance(IDLE / 3 + 1)
    status, raw, _ = await call(http, actor, run)
    assert (status, json.loads(raw)) == (409, INACTIVE)


async def test_sweep_reclaims_without_a_request(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    idle = await create_run(http, actor)
    busy = await create_run(http, actor)
    clock.advance(IDLE / 2)
    assert (await call(http, actor, busy))[0] == 200
    clock.advance(IDLE / 2 + 1)
    assert actor.registry.sweep() == 1
    assert actor.registry.get(idle["run_id"]) is Ended.RECLAIMED
    assert isinstance(actor.registry.get(busy["run_id"]), Run)
    assert await stats(http, actor) == {"created": 2, "reclaimed": 1, "deleted": 0, "active": 1}


async def test_periodic_sweeper_reclaims_idle_runs(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    await create_run(http, actor)
    clock.advance(IDLE + 1)  # wakes the sweeper, whose interval is min(IDLE / 4, 30)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3.0
    while (await stats(http, actor))["reclaimed"] != 1:
        assert loop.time() < deadline, "the sweeper did not reclaim the idle run"
        await asyncio.sleep(0.01)
    assert (await stats(http, actor))["active"] == 0


# -- delete, counters, framework -----------------------------------------------------------


async def test_delete_run(actor: ActorServer, http: aiohttp.ClientSession) -> None:
    run = await create_run(http, actor)
    url = f"{actor.url}/runs/{run['run_id']}"
    async with http.delete(url, headers=control("wrong")) as resp:
        assert resp.status == 401
    assert isinstance(actor.registry.get(run["run_id"]), Run)
    async with http.delete(url, headers=control()) as resp:
        assert resp.status == 200
        assert await resp.json() == {"run_id": run["run_id"], "deleted": True}
    status, raw, _ = await call(http, actor, run)
    assert (status, json.loads(raw)) == (409, INACTIVE)
    async with http.delete(url, headers=control()) as resp:
        assert resp.status == 404
        assert_error(await resp.read(), "run_not_found")
    async with http.delete(actor.url + "/runs/run_nope", headers=control()) as resp:
        assert resp.status == 404
    assert await stats(http, actor) == {"created": 1, "reclaimed": 0, "deleted": 1, "active": 0}


async def test_counters(
    actor: ActorServer, http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    runs = [await create_run(http, actor, f"sess-{i}") for i in range(3)]
    async with http.delete(f"{actor.url}/runs/{runs[0]['run_id']}", headers=control()) as resp:
        assert resp.status == 200
    clock.advance(IDLE / 2)
    assert (await call(http, actor, runs[1]))[0] == 200
    clock.advance(IDLE / 2 + 1)
    assert (await call(http, actor, runs[2]))[0] == 409
    expected = {"created": 3, "reclaimed": 1, "deleted": 1, "active": 1}
    assert await stats(http, actor) == expected
    assert await stats(http, actor, "/stats") == expected


async def test_health_and_framework_errors_are_openai_shaped(
    actor: ActorServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(actor.url + "/health") as resp:
        assert resp.status == 200
    async with http.get(actor.url + "/nowhere") as resp:
        assert resp.status == 404
        assert_error(await resp.read(), "not_found")
    async with http.get(actor.url + "/runs") as resp:
        assert resp.status == 405
        assert_error(await resp.read(), "method_not_allowed")


async def test_secrets_and_tokens_are_never_logged(
    actor: ActorServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run = await create_run(http, actor)
    await call(http, actor, run)
    await call(http, actor, run, body=chat_body(stream=True))
    await call(http, actor, run, token="bad-token-value")
    async with http.delete(f"{actor.url}/runs/{run['run_id']}", headers=control()) as resp:
        assert resp.status == 200
    text = caplog.text
    assert run["run_id"] in text  # the actor does log its runs
    for secret in (CONTROL, JWT_SECRET, run["token"], "bad-token-value"):
        assert secret not in text


# -- command -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({}, [actor_cli.CONTROL_SECRET_ENV, actor_cli.JWT_SECRET_ENV]),
        ({actor_cli.CONTROL_SECRET_ENV: CONTROL}, [actor_cli.JWT_SECRET_ENV]),
        ({actor_cli.JWT_SECRET_ENV: JWT_SECRET}, [actor_cli.CONTROL_SECRET_ENV]),
    ],
)
def test_command_needs_both_secrets(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    missing: list[str],
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(actor_server, "run_actor", lambda *a, **k: calls.append((a, k)))
    for name in (actor_cli.CONTROL_SECRET_ENV, actor_cli.JWT_SECRET_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(typer.Exit) as raised:
        actor_cli.actor_command("http://127.0.0.1:9000", 8100, "127.0.0.1", IDLE, TTL)
    assert raised.value.exit_code == 2
    err = capsys.readouterr().err
    for name in (actor_cli.CONTROL_SECRET_ENV, actor_cli.JWT_SECRET_ENV):
        assert (name in err) == (name in missing)
    for value in env.values():
        assert value not in err
    assert calls == []


def test_command_runs_the_actor_with_secrets_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(actor_server, "run_actor", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setenv(actor_cli.CONTROL_SECRET_ENV, CONTROL)
    monkeypatch.setenv(actor_cli.JWT_SECRET_ENV, JWT_SECRET)
    monkeypatch.delenv(actor_cli.BACKEND_API_KEY_ENV, raising=False)
    with pytest.raises(typer.Exit) as raised:
        actor_cli.actor_command("ftp://nowhere", 8100, "127.0.0.1", IDLE, TTL)
    assert raised.value.exit_code == 2
    assert "backend URL" in capsys.readouterr().err
    actor_cli.actor_command("http://127.0.0.1:9000", 8100, "0.0.0.0", 120.0, 600.0)
    [(args, kwargs)] = calls
    assert args == ("http://127.0.0.1:9000", "0.0.0.0", 8100, 120.0, 600.0)
    assert kwargs["control_secret"] == CONTROL
    assert kwargs["jwt_secret"] == JWT_SECRET
    assert kwargs["backend_api_key"] is None

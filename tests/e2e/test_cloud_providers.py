"""Gemini, Vertex AI and Bedrock deployments behind Ballast, driven by the official openai
SDK against the simulator speaking each provider's wire: chat streamed and not, a tool round
trip, failover from a 429ing OpenAI deployment to Bedrock with no client error, a Vertex
token the remote holds as expired renewed once and the call retried, and config errors that
name the setting."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ballast.config import ConfigError, parse_settings
from ballast.sim.answer import full_text
from ballast.sim.server import SimServer
from tests.e2e.test_provider_probes import drive
from tests.e2e.test_recovery import PROBES, probes
from tests.e2e.test_routing import client as routing_client
from tests.e2e.test_routing import config
from tests.stack import Stack, deployment, group

GEMINI = "gemini-2.0-flash"
BEDROCK = "anthropic.claude-3-haiku-20240307-v1:0"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDGATEWAY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "gateway-secret")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield


def _service_account(tmp_path: Path, sim: SimServer) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "p1",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "gateway@p1.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": sim.url + "/token",
    }
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(info))
    return str(path)


def _gemini(sim: SimServer) -> dict[str, Any]:
    return {"id": "gem", "url": sim.url, "api_key": "gm-secret-key", "model": GEMINI,
            "provider": "gemini"}  # fmt: skip


def _bedrock(sim: SimServer) -> dict[str, Any]:
    return {"id": "bed", "url": sim.url, "model": BEDROCK, "provider": "bedrock",
            "aws": {"region": "us-east-1"}}  # fmt: skip


def _vertex(sim: SimServer, credentials: str) -> dict[str, Any]:
    google = {"project": "p1", "location": "us-central1", "credentials_file": credentials}
    return {"id": "vx", "url": sim.url, "model": GEMINI, "provider": "vertex", "google": google}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0, timeout=20)


def _chat_both_ways(client: openai.OpenAI) -> None:
    user = [{"role": "user", "content": "hello there"}]
    reply = client.chat.completions.create(model="chat", messages=user, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == full_text(4)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    stream = client.chat.completions.create(  # type: ignore[call-overload]
        model="chat",
        messages=user,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert text == full_text(16) and finish == "stop"
    assert usage is not None and usage.completion_tokens == 16


def _tool_round_trip(stack: Stack, sim: SimServer, client: openai.OpenAI, model: str) -> None:
    stack.set_behaviour(sim, "ok?tokens=2&shape=tool", model)
    messages: list[Any] = [{"role": "user", "content": "look up a word"}]
    reply = client.chat.completions.create(model="chat", messages=messages, tools=[TOOL])  # type: ignore[list-item]
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and message.tool_calls[0].function.name == "lookup"  # type: ignore[union-attr]
    assert json.loads(message.tool_calls[0].function.arguments) == {"q": full_text(2)}  # type: ignore[union-attr]
    stream = client.chat.completions.create(
        model="chat",
        messages=messages,
        tools=[TOOL],  # type: ignore[list-item]
        stream=True,
    )
    arguments = ""
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:  # type: ignore[union-attr]
            arguments += (call.function.arguments or "") if call.function else ""
    assert json.loads(arguments) == {"q": full_text(2)}
    stack.set_behaviour(sim, "ok?tokens=3", model)
    call = message.tool_calls[0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"meaning": "a word"}'},
    ]
    final = client.chat.completions.create(model="chat", messages=messages, tools=[TOOL])  # type: ignore[list-item]
    assert final.choices[0].message.content == full_text(3)
    last = stack.attempts(sim)[-1]
    assert last["outcome"] == "ok" and last["model"] == model


def test_gemini_chat_stream_and_tools(stack: Stack) -> None:
    sim = stack.sim(default="ok")
    gateway = stack.gateway({"models": [group("chat", _gemini(sim))]})
    client = _client(gateway.url)
    _chat_both_ways(client)
    _tool_round_trip(stack, sim, client, GEMINI)
    seen = stack.attempts(sim)[0]
    # A whole answer may be read as a stream (the stream clocks guard it): either method.
    assert seen["path"].startswith(f"/v1beta/models/{GEMINI}:")
    assert seen["headers"]["x-goog-api-key"] == "***-key"
    assert "authorization" not in seen["headers"]  # the key goes only where Gemini reads it


def test_bedrock_chat_stream_and_tools(stack: Stack, aws_env: None) -> None:
    sim = stack.sim(default="ok")
    gateway = stack.gateway({"models": [group("chat", _bedrock(sim))]})
    client = _client(gateway.url)
    _chat_both_ways(client)
    _tool_round_trip(stack, sim, client, BEDROCK)
    paths = {a["path"] for a in stack.attempts(sim)}
    assert paths <= {f"/model/{BEDROCK}/converse", f"/model/{BEDROCK}/converse-stream"}
    assert stack.attempts(sim)[0]["headers"]["authorization"].startswith("***")


def test_a_bad_crc_is_a_clear_error_and_fails_over(stack: Stack, aws_env: None) -> None:
    broken = stack.sim(default="bad_crc?at=1", name="broken")
    gateway = stack.gateway({"models": [group("chat", _bedrock(broken))]})
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.APIError) as caught:
        for _chunk in _client(gateway.url).chat.completions.create(
            model="chat",
            messages=user,  # type: ignore[arg-type]
            stream=True,
        ):
            pass
    assert "CRC" in str(caught.value)
    healthy = stack.sim(default="ok?tokens=3", name="healthy")
    backup = {**_bedrock(healthy), "id": "bed2"}
    gateway = stack.gateway({"models": [group("chat", _bedrock(broken), backup)]})
    for _ in range(3):
        stream = _client(gateway.url).chat.completions.create(
            model="chat",
            messages=user,  # type: ignore[arg-type]
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (  # type: ignore[union-attr]
            full_text(3)
        )


def test_failover_from_a_429ing_openai_deployment_to_bedrock(stack: Stack, aws_env: None) -> None:
    openai_sim = stack.sim(default="429?retry_after=30", name="openai")
    bedrock_sim = stack.sim(default="ok?tokens=5", name="bedrock")
    config = {
        "models": [
            group(
                "chat",
                deployment("oa", openai_sim, model="gpt-4o"),
                _bedrock(bedrock_sim),
                strategy="ordered",
            )
        ]
    }
    client = _client(stack.gateway(config).url)
    for index in range(6):
        user = [{"role": "user", "content": f"question {index}"}]
        if index % 2:
            stream = client.chat.completions.create(model="chat", messages=user, stream=True)  # type: ignore[arg-type]
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)  # type: ignore[union-attr]
        else:
            reply = client.chat.completions.create(model="chat", messages=user)  # type: ignore[arg-type]
            text = reply.choices[0].message.content or ""
        assert text == full_text(5)
    assert stack.attempts(openai_sim)[0]["outcome"] == "429"  # tried first, then cooled down
    assert len(stack.attempts(bedrock_sim)) == 6


def test_vertex_renews_an_expired_token_once_and_retries(stack: Stack, tmp_path: Path) -> None:
    sim = stack.sim(default="ok?tokens=4")
    credentials = _service_account(tmp_path, sim)
    gateway = stack.gateway({"models": [group("chat", _vertex(sim, credentials))]})
    client = _client(gateway.url)
    first = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "a"}]
    )
    assert first.choices[0].message.content == full_text(4)
    stack.set_behaviour(sim, "expired_token?tokens=4", GEMINI)  # the token in use expires
    stack.clear_log(sim)
    again = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "b"}]
    )
    assert again.choices[0].message.content == full_text(4)
    attempts = stack.attempts(sim)
    assert [a["outcome"] for a in attempts] == ["401", "ok"]
    tokens = [a["headers"]["authorization"] for a in attempts]
    assert tokens[0] != tokens[1]  # renewed, then retried once
    assert all("/projects/p1/locations/us-central1/" in a["path"] for a in attempts)
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "c"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == full_text(4)
    assert len(stack.attempts(sim)) == 3  # the renewed token is kept


def _config_error(dep: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"models": [group("chat", dep)]})
    return str(caught.value)


def test_config_errors_name_the_missing_setting(tmp_path: Path) -> None:
    base = {"id": "d", "url": "http://127.0.0.1:1", "model": "m"}
    assert "aws.region" in _config_error({**base, "provider": "bedrock"})
    assert "google.project" in _config_error({**base, "provider": "vertex"})
    google = {"project": "p", "location": "l", "credentials_file": str(tmp_path / "none.json")}
    message = _config_error({**base, "provider": "vertex", "google": google})
    assert "google.credentials_file" in message and "none.json" in message
    assert "api_key" in _config_error({**base, "provider": "gemini"})
    assert "needs provider: bedrock" in _config_error({**base, "aws": {"region": "us-east-1"}})


def test_cloud_urls_follow_from_region_and_location() -> None:
    deployments = [
        {"id": "b", "provider": "bedrock", "model": "m", "aws": {"region": "eu-west-1"}},
        {"id": "v", "provider": "vertex", "model": "m",
         "google": {"project": "p", "location": "europe-west4"}},
        {"id": "g", "provider": "gemini", "model": "m", "api_key": "k"},
        {"id": "vg", "provider": "vertex", "model": "m",
         "google": {"project": "p", "location": "global"}},
        {"id": "own", "provider": "bedrock", "model": "m", "url": "http://127.0.0.1:9",
         "aws": {"region": "eu-west-1"}},
    ]  # fmt: skip
    settings = parse_settings({"models": [group("chat", *deployments)]})  # type: ignore[arg-type]
    assert [d.url for d in settings.models[0].deployments] == [
        "https://bedrock-runtime.eu-west-1.amazonaws.com",
        "https://europe-west4-aiplatform.googleapis.com",
        "https://generativelanguage.googleapis.com",
        "https://aiplatform.googleapis.com",
        "http://127.0.0.1:9",
    ]


def test_a_gemini_stream_cut_continues_on_bedrock(stack: Stack, aws_env: None) -> None:
    """Cut after two tokens on Gemini: the rest comes from Bedrock and the client sees one
    whole answer (regenerated, since neither continues a prefill here)."""
    gemini = stack.sim(default="cut?after=2&tokens=6", name="gemini")
    bedrock = stack.sim(default="ok?tokens=6", name="bedrock")
    config = {"models": [group("chat", _gemini(gemini), _bedrock(bedrock), strategy="ordered")]}
    client = _client(stack.gateway(config).url)
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == full_text(6)
    assert stack.attempts(gemini)[0]["outcome"] == "cut"
    assert len(stack.attempts(bedrock)) == 1


@pytest.mark.parametrize(
    ("behaviour", "status", "code"),
    [
        ("context_length", 400, "context_length_exceeded"),
        ("content_filter", 400, "content_filter"),
    ],
)
def test_gemini_refusals_reach_the_client_in_openai_shape(
    stack: Stack, behaviour: str, status: int, code: str
) -> None:
    sim = stack.sim(default=behaviour)
    client = _client(stack.gateway({"models": [group("chat", _gemini(sim))]}).url)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict) and caught.value.body.get("code") == code


def test_openai_429_then_cut_answers_whole_from_bedrock_past_anthropic(
    stack: Stack, aws_env: None
) -> None:
    """OpenAI + Anthropic + Bedrock in one group: OpenAI answers 429, Anthropic is down, and
    later OpenAI is cut mid-stream; every answer is whole, no client error, and the answer
    names the deployment that gave it. Bedrock goes on from the cut text (a prefill)."""
    openai_sim = stack.sim("429?retry_after=0.2", name="oa")
    claude_sim = stack.sim("503", name="cl")
    bedrock_sim = stack.sim("ok?tokens=60", name="bed")
    claude = deployment("cl", claude_sim, model="claude-sim", provider="anthropic")
    bedrock = {**_bedrock(bedrock_sim), "supports_prefill": True}
    models = [group("chat", deployment("oa", openai_sim, model="gpt-sim"), claude, bedrock,
                    strategy="ordered")]  # fmt: skip
    client = _client(stack.gateway({"models": models}).url)
    user: Any = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="chat", messages=user)
    assert reply.choices[0].message.content == full_text(60)
    assert reply.model == BEDROCK  # the model that really answered
    assert stack.attempts(openai_sim)[0]["outcome"] == "429"
    stack.set_behaviour(openai_sim, "cut?after=20&tokens=60")
    time.sleep(0.5)  # the rate-limited deployment's cool-down passes
    stack.clear_log(bedrock_sim)
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=user, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == full_text(60)
    assert raw.headers["x-ballast-deployment"] == "oa"  # the stream started there
    assert stack.attempts(openai_sim)[-1]["outcome"] == "cut"
    (continued,) = stack.attempts(bedrock_sim)
    assert continued["prefill"] is True and continued["tokens"] == 41  # " ", tok20 .. tok59


@pytest.mark.parametrize("provider", ["gemini", "bedrock", "vertex"])
def test_an_open_cloud_deployment_is_probed_back_in_its_own_wire(
    stack: Stack, aws_env: None, tmp_path: Path, provider: str
) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    b = stack.sim("ok?tokens=4&latency=0.05", name="b")
    if provider == "gemini":
        native = _gemini(a)
    elif provider == "bedrock":
        native = _bedrock(a)
    else:
        native = _vertex(a, _service_account(tmp_path, a))
    native = {**native, "id": "a"}
    gateway = stack.gateway(
        config(
            group("chat", native, deployment("b", b, model="m"), strategy="ordered"),
            routing=PROBES,
        )
    )
    api = routing_client(gateway)
    drive(api, 0.5)
    stack.set_behaviour(a, "500")
    during = drive(api, 2.0)
    assert all(who != "a" for _, who in during[3:])
    outage = [p for p in probes(stack, a) if p["path"] != "/token"]
    assert outage, "a was never probed"
    header = {"gemini": "x-goog-api-key", "bedrock": "authorization", "vertex": "authorization"}
    assert all(p["headers"].get(header[provider]) for p in outage)
    stack.set_behaviour(a, "ok?tokens=4")
    recovered = time.monotonic()
    back = [when - recovered for when, who in drive(api, 2.0) if who == "a"]
    assert back and back[0] < 1.0, back


@pytest.mark.parametrize("provider", ["gemini", "bedrock"])
@pytest.mark.parametrize(
    "fault",
    ["429", "500", "503", "reset", "hang", "slow_first?delay=3", "stall?after=2",
     "malformed?at=2", "cut?after=2", "no_done", "error_event?after=2"],
)  # fmt: skip
def test_every_fault_of_a_cloud_deployment_is_healed(
    stack: Stack, aws_env: None, provider: str, fault: str
) -> None:
    """Whatever the native deployment does wrong, the client gets the whole answer from the
    group's other deployment, streamed or not."""
    if fault in ("reset", "hang"):
        spec = fault  # no answer at all
    else:
        spec = fault + ("&tokens=8" if "?" in fault else "?tokens=8")
    broken = stack.sim(spec, name="broken")
    healthy = stack.sim("ok?tokens=8", name="healthy")
    native = _gemini(broken) if provider == "gemini" else _bedrock(broken)
    models = [group("chat", native, deployment("ok", healthy, model="m"), strategy="ordered")]
    api = routing_client(stack.gateway(config(*models)))
    user: Any = [{"role": "user", "content": "hi"}]
    stream = api.chat.completions.create(model="chat", messages=user, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == full_text(8)
    reply = api.chat.completions.create(model="chat", messages=user)
    assert reply.choices[0].message.content == full_text(8)
    assert stack.attempts(broken), "the native deployment was never tried"


@pytest.mark.parametrize("provider", ["gemini", "bedrock"])
def test_whole_answers_asked_as_whole_answers(stack: Stack, aws_env: None, provider: str) -> None:
    """With answers_as_streams off, a whole answer is the provider's own whole answer
    (generateContent, converse), translated; a tool call too."""
    sim = stack.sim("ok?tokens=5")
    native = _gemini(sim) if provider == "gemini" else _bedrock(sim)
    gateway = stack.gateway(
        {"routing": {"answers_as_streams": False}, "models": [group("chat", native)]}
    )
    client = _client(gateway.url)
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "x"}]
    )
    assert reply.choices[0].message.content == full_text(5)
    assert reply.usage is not None and reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    path = stack.attempts(sim)[-1]["path"]
    assert path.endswith(":generateContent") or path.endswith("/converse")
    stack.set_behaviour(sim, "ok?tokens=2&shape=tool")
    reply = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "x"}],
        tools=[TOOL],  # type: ignore[list-item]
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"q": full_text(2)}  # type: ignore[union-attr]
    stack.set_behaviour(sim, "malformed")
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502  # an answer that is not JSON: a bad response

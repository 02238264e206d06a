"""What an operator sees and can do: Prometheus metrics during a real failover, the structured
request and event log, the admin API behind its key, drain/enable, and config reload under
load (a good config takes effect without a failed request; a broken one changes nothing).

Every test here also checks that no secret (upstream keys, the master key, the client's key,
the dashboard token) reached any log record."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ballast.observe.logs import JsonFormatter, TextFormatter
from tests.stack import Gateway, Stack, deployment, free_port, group, serve, wait_for

MASTER = "bk-master-observe-0123456789"
DASHBOARD = "dash-read-only-token-4567"
CLIENT_KEY = "sk-client-observe-secret"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
FAST = {"connect": 1.0, "first_token": 0.5, "inter_chunk": 0.5, "answer": 1.0, "request": 20.0}
SECRETS = (MASTER, DASHBOARD, CLIENT_KEY, "-secret")  # stack.deployment keys are sk-<id>-secret


def full(tokens: int) -> str:
    return "".join(f"tok{i} " for i in range(tokens))


def config(*groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "server": {"master_key": MASTER, "dashboard_token": DASHBOARD},
        "timeouts": FAST,
        "routing": extra.pop("routing", {"breaker": {"failure_threshold": 2}}),
        "models": list(groups),
        **extra,
    }


def client(gateway: Gateway) -> openai.OpenAI:
    # With a master key configured, the master key is also a client key that can use
    # every model (clients need a key once Ballast is not running open).
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER, max_retries=0, timeout=20)


def call(
    method: str, url: str, token: str | None = None, body: Any = None
) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def scrape(gateway: Gateway) -> dict[str, list[tuple[dict[str, str], float]]]:
    return scrape_url(gateway.url)


def scrape_url(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics by sample name: [(labels, value)]."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        assert response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(
        v for got, v in samples.get(name, []) if all(got.get(k) == w for k, w in labels.items())
    )


@pytest.fixture(autouse=True)
def no_secret_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog
    json_format, text_format = JsonFormatter(), TextFormatter()
    for record in caplog.records:
        for line in (json_format.format(record), text_format.format(record), repr(record.args)):
            for secret in SECRETS:
                assert secret not in line, f"a secret reached the log: {line[:300]}"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "ballast.access"
    ]


# -- metrics and logs during a failover ---------------------------------------------------


def test_metrics_show_failover_breaker_transition_and_latency(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    a = stack.sim("500", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a), deployment("b", b), strategy="ordered"))
    )
    before = scrape(gateway)
    assert value(before, "ballast_breaker_state", deployment="a") == 0.0  # known from the start
    api = client(gateway)
    reply = api.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, extra_headers={"x-request-id": "req-observe-1"}
    )
    assert reply.headers["x-request-id"] == "req-observe-1"
    assert reply.parse().choices[0].message.content == full(16)
    for i in range(5):
        if i % 2:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
                if c.choices
            )
        else:
            text = (
                api.chat.completions.create(model="chat", messages=MESSAGES)
                .choices[0]
                .message.content
                or ""
            )
        assert text == full(16)

    samples = scrape(gateway)
    assert value(samples, "ballast_failovers_total", deployment="a", reason="server_error") >= 2
    assert (
        value(
            samples,
            "ballast_breaker_transitions_total",
            deployment="a",
            from_state="closed",
            to_state="open",
        )
        == 1
    )
    assert value(samples, "ballast_breaker_state", deployment="a") == 2.0
    assert value(samples, "ballast_breaker_state", deployment="b") == 0.0
    # The first requests were rescued after a failed attempt, the later ones went straight to b.
    recovered = value(
        samples,
        "ballast_requests_total",
        model="chat",
        deployment="b",
        status="200",
        outcome="recovered",
    )
    direct = value(
        samples, "ballast_requests_total", model="chat", deployment="b", status="200", outcome="ok"
    )
    assert recovered >= 2 and recovered + direct == 6
    assert (
        value(samples, "ballast_request_duration_seconds_count", model="chat", deployment="b") == 6
    )
    buckets = [labels for labels, _ in samples["ballast_request_duration_seconds_bucket"]]
    assert {"model": "chat", "deployment": "b", "le": "+Inf"} in buckets
    assert (
        value(samples, "ballast_time_to_first_token_seconds_count", model="chat", deployment="b")
        == 2
    )
    assert value(samples, "ballast_retries_total", deployment="b") >= 2

    lines = access_lines(caplog)
    assert len(lines) == 6
    first = next(line for line in lines if line["request_id"] == "req-observe-1")
    assert first["model"] == "chat" and first["deployment"] == "b" and first["status"] == 200
    assert first["outcome"] == "recovered" and first["attempts"] == 2
    assert first["latency_ms"] > 0 and first["ttft_ms"] is None
    streamed = [line for line in lines if line["stream"]]
    assert len(streamed) == 2 and all(line["ttft_ms"] > 0 for line in streamed)
    events = [r for r in caplog.records if r.name == "ballast.events"]
    kinds = {getattr(r, "fields", {}).get("event") for r in events}
    assert {"failover", "breaker"} <= kinds
    opened = [r for r in events if getattr(r, "fields", {}).get("to") == "open"]
    assert opened and opened[0].levelno == logging.WARNING


def test_unknown_model_and_bad_requests_are_counted_without_user_strings_as_labels(
    stack: Stack,
) -> None:
    a = stack.sim("ok", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    api = client(gateway)
    for name in ("nope-1", "nope-2"):
        with pytest.raises(openai.NotFoundError):
            api.chat.completions.create(model=name, messages=MESSAGES)
    samples = scrape(gateway)
    assert (
        value(
            samples,
            "ballast_requests_total",
            model="unknown",
            deployment="none",
            status="404",
            outcome="rejected",
        )
        == 2
    )
    assert not any("nope" in str(labels) for labels, _ in samples["ballast_requests_total"])


# -- admin API ----------------------------------------------------------------------------


def test_admin_api_needs_the_master_key_and_the_dashboard_token_only_reads(stack: Stack) -> None:
    a = stack.sim("ok", name="a")
    gateway = stack.gateway(config(group("chat", deployment("a", a))))
    url = gateway.url
    status, body = call("GET", url + "/admin/state")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = call("GET", url + "/admin/state", token="wrong")
    assert status == 401 and body["error"]["type"] == "invalid_request_error"
    status, body = call("GET", url + "/admin/state", token=CLIENT_KEY)
    assert status == 401
    status, body = call("GET", url + "/admin/state", token=MASTER)
    assert status == 200
    [chat] = body["models"]
    [dep] = chat["deployments"]
    assert dep["id"] == "a" and dep["breaker"]["state"] == "closed" and dep["drained"] is False
    assert {"score", "in_flight", "cooldown", "health", "handles", "traffic"} <= dep.keys()
    assert body["redis"] == {"status": "not configured"} or "status" in body["redis"]
    assert "status" in body["database"]
    # The read-only token reads, but cannot change anything.
    assert call("GET", url + "/admin/state", token=DASHBOARD)[0] == 200
    assert call("GET", url + "/admin/events", token=DASHBOARD)[0] == 200
    assert call("POST", url + "/admin/deployments/a/drain", token=DASHBOARD)[0] == 401
    assert call("POST", url + "/admin/reload", token=DASHBOARD)[0] == 401
    assert call("GET", url + "/admin/config", token=DASHBOARD)[0] == 401
    status, body = call("GET", url + "/admin/config", token=MASTER)
    assert status == 200 and body["server"]["master_key"] == "****"
    assert "-secret" not in json.dumps(body)
    assert call("GET", url + "/admin/nothing", token=MASTER)[0] == 404
    assert call("GET", url + "/admin/deployments/a/drain", token=MASTER)[0] == 405
    # The dashboard page takes the token in the query string too.
    assert call_page(url + "/dashboard") == 401
    assert call_page(url + f"/dashboard?token={DASHBOARD}") == 200
    assert call_page(url + f"/dashboard?token={MASTER}") == 200
    assert call_page(url + "/dashboard?token=nope") == 401


def call_page(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["content-type"].startswith("text/html")
            assert b"<title>Ballast</title>" in response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_admin_api_is_disabled_without_a_master_key(stack: Stack) -> None:
    a = stack.sim("ok", name="a")
    gateway = stack.gateway({"models": [group("chat", deployment("a", a))]})
    status, body = call("GET", gateway.url + "/admin/state", token="anything")
    assert status == 403 and body["error"]["code"] == "admin_disabled"
    assert call("POST", gateway.url + "/admin/deployments/a/drain", token="x")[0] == 403


def test_drain_moves_traffic_away_and_enable_brings_it_back(stack: Stack) -> None:
    a = stack.sim("ok", name="a")
    b = stack.sim("ok", name="b")
    gateway = stack.gateway(
        config(group("chat", deployment("a", a), deployment("b", b), strategy="ordered"))
    )
    api = client(gateway)

    def served() -> str:
        fingerprint = api.chat.completions.create(
            model="chat", messages=MESSAGES
        ).system_fingerprint
        assert fingerprint is not None
        return fingerprint.removeprefix("sim:")

    assert served() == "a"
    status, body = call("POST", gateway.url + "/admin/deployments/a/drain", token=MASTER)
    assert status == 200 and body["drained"] is True
    assert {served() for _ in range(5)} == {"b"}
    state = call("GET", gateway.url + "/admin/state", token=MASTER)[1]
    assert state["models"][0]["deployments"][0]["drained"] is True
    events = call("GET", gateway.url + "/admin/events", token=MASTER)[1]["events"]
    assert [e["event"] for e in events] == ["drain"]
    assert call("POST", gateway.url + "/admin/deployments/a/enable", token=MASTER)[0] == 200
    assert served() == "a"
    since = events[-1]["seq"]
    later = call("GET", gateway.url + f"/admin/events?since={since}", token=MASTER)[1]["events"]
    assert [e["event"] for e in later] == ["enable"]
    assert call("POST", gateway.url + "/admin/deployments/zzz/drain", token=MASTER)[0] == 404


# -- reload ---------------------------------------------------------------------------------


class Load:
    """Client threads sending a mix of streamed and whole requests until stopped."""

    def __init__(self, gateway: Gateway, threads: int = 6) -> None:
        self.api = client(gateway)
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.served: list[str] = []
        self.started: list[tuple[float, str]] = []  # (when the request began, who answered)
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, n: int) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                if n % 2:
                    text, who = "", ""
                    for chunk in self.api.chat.completions.create(
                        model="chat", messages=MESSAGES, stream=True
                    ):
                        who = who or (chunk.system_fingerprint or "")
                        if chunk.choices:
                            text += chunk.choices[0].delta.content or ""
                else:
                    reply = self.api.chat.completions.create(model="chat", messages=MESSAGES)
                    text, who = (
                        reply.choices[0].message.content or "",
                        reply.system_fingerprint or "",
                    )
                with self._lock:
                    if text == full(8):
                        self.ok += 1
                        self.served.append(who.removeprefix("sim:"))
                        self.started.append((began, who.removeprefix("sim:")))
                    else:
                        self.failures.append(f"incomplete: {text!r}")
            except openai.APIError as exc:
                with self._lock:
                    self.failures.append(repr(exc))

    def count(self) -> int:
        with self._lock:
            return self.ok + len(self.failures)


def test_reload_adds_a_deployment_without_a_failed_request_and_refuses_a_broken_config(
    stack: Stack, tmp_path: Path
) -> None:
    slow = "ok?tokens=8&delay=0.02"  # every answer takes ~0.16 s: some are always in flight
    a = stack.sim(slow, name="a")
    b = stack.sim(slow, name="b")
    path = tmp_path / "ballast.yaml"
    # Generous clocks: on a loaded machine a slow first token must not send a request to a.
    patient = {"first_token": 5, "inter_chunk": 5, "answer": 10}
    path.write_text(yaml.safe_dump(config(group("chat", deployment("a", a)), timeouts=patient)))
    gateway = stack.gateway(config(group("chat", deployment("a", a)), timeouts=patient))
    gateway.app.config_path = str(path)
    new = config(
        group("chat", deployment("b", b), deployment("a", a), strategy="ordered"),
        timeouts=patient,
    )
    with Load(gateway) as load:
        wait_for(lambda: load.count() >= 20)
        wait_for(lambda: gateway.app.generation.in_flight > 0)
        path.write_text(yaml.safe_dump(new))
        status, body = call("POST", gateway.url + "/admin/reload", token=MASTER)
        assert (status, body["status"], body["generation"]) == (200, "reloaded", 2)
        reloaded = time.monotonic()
        seen = load.count()
        wait_for(lambda: load.count() >= seen + 40)
    assert load.failures == []
    after = [who for started, who in load.started if started > reloaded]
    assert len(after) >= 30 and set(after) == {"b"}  # every request begun after the swap
    state = call("GET", gateway.url + "/admin/state", token=MASTER)[1]
    assert state["generation"] == 2
    assert [d["id"] for d in state["models"][0]["deployments"]] == ["b", "a"]
    wait_for(lambda: state_of(gateway)["retiring_generations"] == 0)

    # A broken config: refused with its errors, and nothing changes.
    broken = config(
        group("chat", deployment("b", b), {"id": "c", "url": "not a url"}),
        timeouts={"first_token": -1},
    )
    path.write_text(yaml.safe_dump(broken))
    with Load(gateway, threads=2) as load:
        wait_for(lambda: load.count() >= 5)
        status, body = call("POST", gateway.url + "/admin/reload", token=MASTER)
        seen = load.count()
        wait_for(lambda: load.count() >= seen + 10)
    assert status == 400 and body["error"]["code"] == "invalid_config"
    url_error = "models[0].deployments[1].url: not a URL: it has no scheme; add http:// or"
    assert any(line.startswith(url_error) for line in body["errors"])
    assert any(line.startswith("timeouts.first_token:") for line in body["errors"])
    assert load.failures == [] and set(load.served) == {"b"}
    state = state_of(gateway)
    assert state["generation"] == 2
    assert [d["id"] for d in state["models"][0]["deployments"]] == ["b", "a"]
    path.write_text("models: [unclosed")
    status, body = call("POST", gateway.url + "/admin/reload", token=MASTER)
    assert status == 400 and "not valid YAML" in body["errors"][0]
    samples = scrape(gateway)
    assert value(samples, "ballast_config_reloads_total", result="ok") == 1
    assert value(samples, "ballast_config_reloads_total", result="refused") == 2


def state_of(gateway: Gateway) -> dict[str, Any]:
    return call("GET", gateway.url + "/admin/state", token=MASTER)[1]


# -- the real command: SIGHUP and JSON logs on stderr -------------------------------------


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="SIGHUP is POSIX only")
def test_serve_reloads_on_sighup_and_logs_json_lines_without_secrets(
    stack: Stack, tmp_path: Path
) -> None:
    a = stack.sim("ok?tokens=4", name="a")
    b = stack.sim("ok?tokens=4", name="b")
    path = tmp_path / "ballast.yaml"
    one = config(group("chat", deployment("a", a)))
    one["server"]["master_key"] = "${OBSERVE_MASTER}"
    path.write_text(yaml.safe_dump(one))
    port = free_port()
    env = {**os.environ, "OBSERVE_MASTER": MASTER}
    log_file = tmp_path / "stderr.log"
    with log_file.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ballast",
                "serve",
                "--config",
                str(path),
                "--port",
                str(port),
                "--log-format",
                "json",
            ],
            env=env,
            stderr=stderr,
            stdout=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout=20)
        api = openai.OpenAI(base_url=url + "/v1", api_key=MASTER, max_retries=0, timeout=10)
        assert (
            api.chat.completions.create(model="chat", messages=MESSAGES).system_fingerprint
            == "sim:a"
        )
        two = config(group("chat", deployment("b", b), deployment("a", a), strategy="ordered"))
        two["server"]["master_key"] = "${OBSERVE_MASTER}"
        path.write_text(yaml.safe_dump(two))
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: call("GET", url + "/admin/state", token=MASTER)[1]["generation"] == 2)
        assert (
            api.chat.completions.create(model="chat", messages=MESSAGES).system_fingerprint
            == "sim:b"
        )
        # The audit log says who reloaded: the signal.
        audit = call("GET", url + "/admin/audit", token=MASTER)[1]["data"]
        assert [(e["actor"], e["action"]) for e in audit] == [("signal", "reload")]
    finally:
        process.terminate()
        process.wait(15)
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]
    requests = [line for line in lines if line.get("msg") == "request"]
    assert [r["deployment"] for r in requests] == ["a", "b"]
    assert all(r["status"] == 200 and r["outcome"] == "ok" for r in requests)
    assert any(line.get("event") == "reload" for line in lines)
    text = log_file.read_text()
    for secret in SECRETS:
        assert secret not in text


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_two_workers_report_every_request_whichever_answers_the_scrape(
    stack: Stack, tmp_path: Path
) -> None:
    a = stack.sim("ok?tokens=2", name="a")
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config(group("chat", deployment("a", a)))))
    port = free_port()
    process = serve(path, port, workers=2)
    url = f"http://127.0.0.1:{port}"
    total = 24
    try:
        wait_for(lambda: _ready(url), timeout=30)
        for _ in range(total):  # a new connection each: the kernel spreads them over workers
            status, _ = call(
                "POST",
                url + "/v1/chat/completions",
                MASTER,
                {"model": "chat", "messages": MESSAGES},
            )
            assert status == 200

        def counted() -> bool:
            # Each scrape may reach either worker; both must see all of them.
            return all(
                value(scrape_url(url), "ballast_requests_total", model="chat", status="200")
                == total
                and value(scrape_url(url), "ballast_request_duration_seconds_count", model="chat")
                == total
                for _ in range(4)
            )

        wait_for(counted, timeout=10)
    finally:
        process.terminate()
        process.wait(15)
    assert process.returncode == 0

"""Tracing that works with the standard variables alone: `ballast serve` with only
`OTEL_EXPORTER_OTLP_ENDPOINT` set exports its spans over OTLP/HTTP to a receiver that
decodes them with the official protobuf messages: one request span with the GenAI
attributes (model, tokens, finish reason) and one span per attempt under it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.stack import Stack, deployment, free_port, group, serve, wait_for

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
from tests.otlp_receiver import OtlpReceiver

STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    try:
        yield running
    finally:
        running.close()


def test_spans_reach_an_otlp_receiver_with_genai_attributes(
    stack: Stack,
    receiver: OtlpReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, healthy = stack.sim("500"), stack.sim("ok")
    config = tmp_path / "ballast.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
                "models": [
                    group(
                        "m",
                        deployment("a", failing, model="up-a"),
                        deployment("b", healthy, model="up-b"),
                        strategy="ordered",
                    )
                ],
            }
        )
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ballast-under-test")
    port = free_port()
    process = serve(config, port, workers=1)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url), timeout=30)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(
            url + "/v1/chat/completions",
            data=body.encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=20) as response:
            answer = json.loads(response.read())
        wait_for(lambda: receiver.named("ballast.request"), timeout=15)
    finally:
        process.terminate()
        process.wait(timeout=30)
    (span,) = receiver.named("ballast.request")
    attrs = span.attributes
    assert span.resource["service.name"] == "ballast-under-test"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "m"
    assert attrs["gen_ai.response.model"] == answer["model"]
    assert attrs["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == [answer["choices"][0]["finish_reason"]]
    assert attrs["http.response.status_code"] == 200 and attrs["ballast.attempts"] == 2
    attempts = receiver.named("ballast.attempt")
    assert [a.attributes["ballast.deployment"] for a in attempts] == ["a", "b"]
    assert [a.attributes["gen_ai.request.model"] for a in attempts] == ["up-a", "up-b"]
    assert {a.attributes["gen_ai.provider.name"] for a in attempts} == {"openai"}
    assert attempts[0].status_code == STATUS_ERROR
    assert all(a.parent_span_id == span.span_id and a.trace_id == span.trace_id for a in attempts)


def test_one_trace_joins_the_client_the_gateway_and_the_upstream(
    stack: Stack,
    receiver: OtlpReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client's W3C `traceparent` is the request span's parent, and the upstream is sent
    the attempt span's context: one trace id from the client to the model server."""
    sim = stack.sim("ok")
    config = tmp_path / "ballast.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
                "models": [group("m", deployment("a", sim))],
            }
        )
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    command = [sys.executable, "-m", "ballast", "serve", "--config", str(config)]
    command += ["--port", str(port), "--log-level", "info"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url), timeout=30)
        for stream in (False, True):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            request = urllib.request.Request(
                url + "/v1/chat/completions",
                data=json.dumps({**body, "stream": stream}).encode(),
                headers={
                    "content-type": "application/json",
                    "traceparent": f"00-{trace_id}-{client_span}-01",
                    "tracestate": "vendor=client",
                },
            )
            with urllib.request.urlopen(request, timeout=20) as response:
                response.read()
        wait_for(lambda: len(receiver.named("ballast.attempt")) == 2, timeout=15)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
    requests = receiver.named("ballast.request")
    attempts = receiver.named("ballast.attempt")
    assert len(requests) == 2
    assert all(r.trace_id.hex() == trace_id for r in requests + attempts)
    assert all(r.parent_span_id.hex() == client_span for r in requests)
    sent = [a["headers"] for a in stack.attempts(sim)]
    assert len(sent) == 2
    for headers, attempt in zip(sent, attempts, strict=True):
        version, upstream_trace, parent, flags = headers["traceparent"].split("-")
        assert (version, upstream_trace, flags) == ("00", trace_id, "01")
        assert parent == attempt.span_id.hex()  # the model server's spans go under the attempt
        assert headers["tracestate"] == "vendor=client"
    # One line at start-up says where the spans go.
    lines = (tmp_path / "serve.log").read_text().splitlines()
    said = [line for line in lines if "tracing on" in line]
    assert len(said) == 1 and f"{receiver.url}/v1/traces" in said[0], said


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200  # type: ignore[no-any-return]
    except OSError:
        return False


def test_no_export_when_sdk_disabled(
    stack: Stack, receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "ballast.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "observe": {"tracing": True},
                "state": {"database_url": f"sqlite:///{tmp_path / 'ballast.db'}"},
                "models": [group("m", deployment("a", stack.sim()))],
            }
        )
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    port = free_port()
    process = serve(config, port, workers=1)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url), timeout=30)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(
            url + "/v1/chat/completions",
            data=body.encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=20):
            pass
    finally:
        process.send_signal(subprocess.signal.SIGTERM)  # type: ignore[attr-defined]
        process.wait(timeout=30)  # a clean exit flushes whatever was batched
    assert receiver.requests == 0

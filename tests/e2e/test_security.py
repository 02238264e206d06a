"""Security properties SECURITY.md claims: no client can choose where Ballast connects, every
admin route needs the master key, secrets are compared in constant time, CORS is off, and
`serve` speaks TLS when given a certificate."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ballast.api import admin_auth as admin_module
from ballast.config import parse_settings
from ballast.pipeline import access as access_module
from tests.e2e.test_routing import MESSAGES
from tests.stack import Stack, deployment, free_port, group

MASTER = "sk-master-security"


class Canary:
    """A listening socket that records every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_no_client_input_chooses_an_upstream(stack: Stack) -> None:
    canary = Canary()
    sim = stack.sim("ok?tokens=2")
    # A wildcard group forwards the client's model name: still only to its deployment.
    gw = stack.gateway(
        {
            "models": [
                group("chat", deployment("a", sim, model="sim-chat")),
                group("open-*", deployment("w", sim)),
            ]
        }
    )
    evil = f"http://127.0.0.1:{canary.port}"
    models = [
        evil + "/v1",
        f"127.0.0.1:{canary.port}",
        "../../v1/chat",
        "chat/../../admin",
        f"//127.0.0.1:{canary.port}/",
        f"chat\r\nHost: 127.0.0.1:{canary.port}",
        "open-x\r\nHost: evil",
        f"open-{evil}",
        "open-../../x",
    ]
    try:
        for model in models:
            status, _ = _post(
                gw.url + "/v1/chat/completions", {"model": model, "messages": MESSAGES}
            )
            assert status in (200, 404), model
        status, _ = _post(
            gw.url + "/v1/chat/completions",
            {"model": "chat", "messages": MESSAGES, "fallbacks": [evil, "../x", "nope"]},
        )
        assert status == 200
        for header in ("host", "x-forwarded-host", "x-ballast-upstream", "x-upstream-url"):
            status, _ = _post(
                gw.url + "/v1/chat/completions",
                {"model": "chat", "messages": MESSAGES, "base_url": evil, "api_base": evil},
                {header: f"127.0.0.1:{canary.port}"},
            )
            assert status == 200
        time.sleep(0.3)
        assert canary.connections == 0
    finally:
        canary.close()
    # Everything that reached an upstream reached the configured one, on its own paths.
    attempts = stack.attempts(sim)
    assert attempts and all(a["path"] == "/v1/chat/completions" for a in attempts)
    assert {a["model"] for a in attempts} <= {"sim-chat", *[m for m in models if "open-" in m]}


def test_every_admin_route_needs_the_master_key(stack: Stack) -> None:
    sim = stack.sim("ok")
    gw = stack.gateway(
        {
            "server": {
                "master_key": MASTER,
                "dashboard_token": "dash-token",
                # Every wrong key below must meet its 401, not the lock-out that follows.
                "admin_failure_limit": 1000,
            },
            "models": [group("chat", deployment("a", sim))],
        }
    )
    routes = list(gw.app.admin._routes)
    routes += [("POST", "/admin/deployments/a/drain"), ("POST", "/admin/deployments/a/enable")]
    assert len(routes) >= 6
    for method, path in routes:
        for auth in (None, "Bearer wrong", "Bearer " + MASTER[:-1], "Basic " + MASTER):
            request = urllib.request.Request(gw.url + path, method=method, data=b"{}")
            request.add_header("content-type", "application/json")
            if auth:
                request.add_header("authorization", auth)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=5)
            assert refused.value.code == 401, (method, path, auth)
    write_routes = [(m, p) for (m, p), (_, write) in gw.app.admin._routes.items() if write]
    for method, path in write_routes:  # the read-only dashboard token cannot write
        request = urllib.request.Request(gw.url + path, method=method, data=b"{}")
        request.add_header("authorization", "Bearer dash-token")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401, (method, path)
    assert gw.app.router.targets["a"].drained is False


def test_admin_pages_are_never_framed_and_run_only_their_own_files(stack: Stack) -> None:
    sim = stack.sim("ok")
    gw = stack.gateway(
        {
            "server": {"master_key": MASTER, "dashboard_token": "dash-token"},
            "models": [group("chat", deployment("a", sim))],
        }
    )
    pages = {}
    for path in ("/ui", "/ui/admin.js", "/ui/admin.css", "/dashboard?token=dash-token"):
        with urllib.request.urlopen(gw.url + path, timeout=5) as response:
            headers = response.headers
            pages[path] = response.read().decode()
        assert headers["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff", path
        assert headers["cache-control"] == "no-store", path
    with urllib.request.urlopen(gw.url + "/ui", timeout=5) as response:
        policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe" not in policy
    assert "connect-src 'self'" in policy and "form-action 'none'" in policy
    # No inline script for the policy to allow, and no data ever parsed as HTML.
    assert pages["/ui"].count("<script") == pages["/ui"].count('<script src="ui/admin.js"') == 1
    script = pages["/ui/admin.js"]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    assert "document.cookie" not in script and "localStorage" not in script


def test_secrets_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = access_module.hmac.compare_digest  # type: ignore[attr-defined]

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)  # type: ignore[no-any-return]

    monkeypatch.setattr(access_module.hmac, "compare_digest", spy)  # type: ignore[attr-defined]
    settings = parse_settings(
        {
            "server": {"master_key": MASTER},
            "models": [{"name": "m", "deployments": [{"id": "a", "url": "http://h:1"}]}],
        },
        environ={},
    )
    checker = access_module.Access(settings, None, None, None)  # type: ignore[arg-type]
    assert checker.is_master(MASTER) and not checker.is_master(MASTER + "x")
    assert admin_module._same(MASTER, settings.server.master_key)
    assert not admin_module._same("nope", settings.server.master_key)
    assert len(calls) == 4  # every comparison of a secret went through compare_digest


def test_cors_is_off(stack: Stack) -> None:
    sim = stack.sim("ok?tokens=2")
    gw = stack.gateway({"models": [group("chat", deployment("a", sim))]})
    origin = {"origin": "https://evil.example", "access-control-request-method": "POST"}
    preflight = urllib.request.Request(
        gw.url + "/v1/chat/completions", method="OPTIONS", headers=origin
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(preflight, timeout=5)
    assert refused.value.code == 405
    assert not [h for h in refused.value.headers if h.lower().startswith("access-control-")]
    request = urllib.request.Request(gw.url + "/v1/models", headers={"origin": "https://e.x"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert not [h for h in response.headers if h.lower().startswith("access-control-")]
    request = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=json.dumps({"model": "chat", "messages": MESSAGES}).encode(),
        headers={"origin": "https://e.x", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert not [h for h in response.headers if h.lower().startswith("access-control-")]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_serve_speaks_tls_with_a_certificate(stack: Stack, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    sim = stack.sim("ok?tokens=2")
    config = {
        "state": {
            "database_url": f"sqlite:///{tmp_path / 'b.db'}",
            "spend_journal": str(tmp_path / "j"),
        },
        "models": [{"name": "chat", "deployments": [{"id": "a", "url": sim.url + "/v1"}]}],
    }
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "log").open("wb")  # the child keeps its own descriptor
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
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ},
    )
    log.close()
    context = ssl.create_default_context(cafile=str(cert))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                url = f"https://127.0.0.1:{port}/health"
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    assert response.status == 200
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps({"model": "chat", "messages": MESSAGES}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            assert json.loads(response.read())["choices"]
        with pytest.raises((urllib.error.URLError, OSError)):  # no plain HTTP on that port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "chat", "messages": MESSAGES}),
        ("/v1/messages", {"model": "chat", "messages": MESSAGES, "max_tokens": 5}),
    ],
)
def test_an_upstream_error_echoing_the_deployments_key_reaches_the_client_scrubbed(
    stack: Stack, path: str, body: dict[str, Any]
) -> None:
    upstream_key = "sk-upstream-key-of-the-deployment"
    sim = stack.sim(f"content_filter?reason=your key {upstream_key} is flagged")
    gw = stack.gateway(
        {
            "server": {"master_key": MASTER},
            "models": [group("chat", deployment("a", sim, api_key=upstream_key))],
        }
    )
    request = urllib.request.Request(
        gw.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"authorization": f"Bearer {MASTER}", "content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    answer = refused.value.read().decode()
    assert upstream_key not in answer
    assert "your key **** is flagged" in answer  # the rest passes as the upstream said it

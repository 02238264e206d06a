"""Outbound proxies: HTTPS_PROXY/HTTP_PROXY/NO_PROXY and a deployment's own `proxy`, CONNECT
tunnels with TLS to the origin inside, absolute-form requests for plain http, and proxy
failures reported as connect failures."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ballast.config import ConfigError, Deployment, Timeouts, UpstreamSettings, parse_settings
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.client import Upstream, UpstreamRequest
from ballast.upstream.http1 import split_url
from ballast.upstream.proxy import NoProxy, parse_proxy, policy_for
from tests.connect_proxy import ConnectProxy
from tests.tls_upstream import OkServer, Pki

CHAT = UpstreamRequest("/chat/completions", b"{}")

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


class Loopback:
    """Starts upstreams and proxies for a test and stops them after it."""

    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self.servers: list[OkServer] = []
        self.proxies: list[ConnectProxy] = []

    async def upstream(self, tls: bool = True) -> tuple[OkServer, int]:
        server = OkServer()
        self.servers.append(server)
        return server, await server.start(self.pki.server_context() if tls else None)

    async def proxy(self, **kw: Any) -> tuple[ConnectProxy, int]:
        proxy = ConnectProxy(**kw)
        self.proxies.append(proxy)
        return proxy, await proxy.start()

    async def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for proxy in self.proxies:
            await proxy.stop()


@pytest.fixture
async def loopback(pki: Pki) -> AsyncIterator[Loopback]:
    running = Loopback(pki)
    yield running
    await running.stop()


async def post_twice(deployment: dict[str, Any], pki: Pki) -> list[int]:
    """Two requests from one deployment; their statuses."""
    if deployment["url"].startswith("https:"):
        deployment = {"tls": {"ca_file": str(pki.ca)}, **deployment}
    upstream = Upstream(
        Deployment.model_validate({"id": "d", **deployment}),
        Timeouts(connect=2.0),
        UpstreamSettings(),
    )
    await upstream.start()
    statuses = []
    try:
        for _ in range(2):
            response = await upstream.post(CHAT)
            assert await response.read() == b'{"ok":true}'
            response.release()
            statuses.append(response.status)
    finally:
        await upstream.close()
    return statuses


async def test_https_goes_through_a_connect_tunnel_when_https_proxy_is_set(
    loopback: Loopback, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = await loopback.upstream()
    proxy, proxy_port = await loopback.proxy()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy_port}")
    assert await post_twice({"url": f"https://127.0.0.1:{port}/v1"}, pki) == [200, 200]
    assert proxy.connects == [f"127.0.0.1:{port}"]  # one tunnel, kept alive for both
    assert server.connections == 1 and len(server.requests) == 2
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")


async def test_a_no_proxy_host_goes_direct(
    loopback: Loopback, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = await loopback.upstream()
    proxy, proxy_port = await loopback.proxy()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy_port}")
    monkeypatch.setenv("NO_PROXY", "internal.example,127.0.0.2")
    assert await post_twice({"url": f"https://127.0.0.1:{port}/v1"}, pki) == [200, 200]
    assert proxy.connects == [f"127.0.0.1:{port}"]  # not listed: through the proxy
    monkeypatch.setenv("NO_PROXY", "internal.example, 127.0.0.0/8")
    assert await post_twice({"url": f"https://127.0.0.1:{port}/v1"}, pki) == [200, 200]
    assert proxy.connects == [f"127.0.0.1:{port}"]  # listed: direct
    assert server.connections == 2


async def test_a_deployments_proxy_wins_over_the_environment(
    loopback: Loopback, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = await loopback.upstream()
    from_env, env_port = await loopback.proxy()
    own, own_port = await loopback.proxy()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{env_port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    url = f"https://127.0.0.1:{port}/v1"
    assert await post_twice({"url": url, "proxy": f"http://127.0.0.1:{own_port}"}, pki) == [
        200,
        200,
    ]
    assert own.connects == [f"127.0.0.1:{port}"] and from_env.connects == []
    monkeypatch.delenv("NO_PROXY")
    assert await post_twice({"url": url, "proxy": "none"}, pki) == [200, 200]
    assert from_env.connects == []


async def test_plain_http_goes_to_the_proxy_in_absolute_form(
    loopback: Loopback, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = await loopback.upstream(tls=False)
    basic = base64.b64encode(b"svc:p@ss").decode()
    proxy, proxy_port = await loopback.proxy(credentials=basic)
    monkeypatch.setenv("http_proxy", f"http://svc:p%40ss@127.0.0.1:{proxy_port}")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")  # the lower-case one wins
    assert await post_twice({"url": f"http://127.0.0.1:{port}/v1"}, pki) == [200, 200]
    line = f"POST http://127.0.0.1:{port}/v1/chat/completions HTTP/1.1".encode()
    assert proxy.request_lines == [line, line]
    assert proxy.authorizations == [f"Basic {basic}"] * 2
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"proxy-authorization" not in server.requests[0].lower()


async def test_connect_sends_the_proxys_credentials(
    loopback: Loopback, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = await loopback.upstream()
    basic = base64.b64encode(b"svc:secret").decode()
    proxy, proxy_port = await loopback.proxy(credentials=basic)
    url = f"https://127.0.0.1:{port}/v1"
    given = {"url": url, "proxy": f"http://svc:secret@127.0.0.1:{proxy_port}"}
    assert await post_twice(given, pki) == [200, 200]
    assert proxy.authorizations == [f"Basic {basic}"]
    with pytest.raises(Failure) as caught:
        await post_twice({"url": url, "proxy": f"http://127.0.0.1:{proxy_port}"}, pki)
    assert caught.value.kind is failures.CONNECT  # 407: a connect failure


@pytest.mark.parametrize("refusal", ["refused", "403"])
async def test_a_failing_proxy_is_a_connect_failure(
    loopback: Loopback, pki: Pki, refusal: str
) -> None:
    _, port = await loopback.upstream()
    if refusal == "refused":
        proxy, proxy_port = await loopback.proxy()
        await proxy.stop()  # nothing listens there any more
    else:
        proxy, proxy_port = await loopback.proxy(status=403)
    with pytest.raises(Failure) as caught:
        given = {"url": f"https://127.0.0.1:{port}/v1", "proxy": f"http://127.0.0.1:{proxy_port}"}
        await post_twice(given, pki)
    assert caught.value.kind is failures.CONNECT


def test_no_proxy_matching() -> None:
    rules = NoProxy("example.com, .corp.internal,api.lab:8443,10.0.0.0/8,[::1]:9000,192.0.2.7")
    assert rules.bypasses("example.com", 443) and rules.bypasses("API.Example.com.", 443)
    assert not rules.bypasses("notexample.com", 443)
    assert rules.bypasses("corp.internal", 80) and rules.bypasses("a.b.corp.internal", 80)
    assert rules.bypasses("api.lab", 8443) and not rules.bypasses("api.lab", 443)
    assert rules.bypasses("10.1.2.3", 80) and not rules.bypasses("11.0.0.1", 80)
    assert rules.bypasses("::1", 9000) and not rules.bypasses("::1", 9001)
    assert rules.bypasses("192.0.2.7", 1) and not rules.bypasses("192.0.2.8", 1)
    assert NoProxy(" * ").bypasses("anything.example", 1)
    assert not NoProxy("").bypasses("example.com", 443)


def test_the_environment_is_read_once_with_lower_case_first() -> None:
    https = split_url("https://api.example.com/v1")[0]
    http = split_url("http://api.example.com/v1")[0]
    environ = {"HTTPS_PROXY": "proxy.corp:3128", "https_proxy": "", "HTTP_PROXY": "h:1"}
    policy = policy_for("d", None, environ)
    assert policy is not None
    assert policy.for_origin(https) is None  # set empty, the lower-case spelling wins
    assert policy.for_origin(http) == parse_proxy("http://h:1")
    assert policy_for("d", None, {"NO_PROXY": "*"}) is None
    only_upper = policy_for("d", None, {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "*"})
    assert only_upper is not None and only_upper.for_origin(https) is None


def test_an_unusable_proxy_is_a_config_error_that_hides_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        policy_for("d", None, {"HTTPS_PROXY": "socks5://svc:hunter2@proxy:1080"})
    assert "HTTPS_PROXY" in str(caught.value) and "hunter2" not in str(caught.value)
    data = {
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "d1", "url": "http://h/v1", "proxy": "socks5://svc:hunter2@p:1"}
                ],
            }
        ]
    }
    with pytest.raises(ConfigError) as config_error:
        parse_settings(data)
    assert "'d1'" in str(config_error.value) and "hunter2" not in str(config_error.value)


def test_a_deployments_proxy_setting_is_masked_and_none_means_direct() -> None:
    from ballast.config import masked

    settings = parse_settings(
        {
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {"id": "a", "url": "http://h/v1", "proxy": "http://svc:hunter2@p:3128"},
                        {"id": "b", "url": "http://h/v1", "proxy": "none"},
                    ],
                }
            ]
        }
    )
    assert "hunter2" not in str(masked(settings))
    direct = settings.models[0].deployments[1].proxy
    assert policy_for("b", direct, {"HTTPS_PROXY": "p:1", "HTTP_PROXY": "p:1"}) is None

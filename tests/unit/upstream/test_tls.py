"""Per-deployment TLS: a private CA trusted by one deployment only, a client certificate
presented when configured, verification off for a lab, and clear errors for bad files."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ballast.config import ConfigError, Deployment, Timeouts, UpstreamSettings, parse_settings
from ballast.resilience.failures import Failure
from ballast.upstream.client import Upstream, UpstreamRequest
from tests.tls_upstream import OkServer, Pki

CHAT = UpstreamRequest("/chat/completions", b"{}")


@pytest.fixture
async def servers() -> AsyncIterator[list[OkServer]]:
    started: list[OkServer] = []
    yield started
    for server in started:
        server.stop()


async def tls_server(servers: list[OkServer], pki: Pki, require_client: bool = False) -> int:
    server = OkServer()
    servers.append(server)
    return await server.start(pki.server_context(require_client))


async def call(port: int, tls: dict[str, Any] | None = None) -> int:
    """One request from a deployment with `tls` settings; the answer's status."""
    deployment = Deployment.model_validate(
        {"id": "private", "url": f"https://127.0.0.1:{port}/v1", "tls": tls}
    )
    upstream = Upstream(deployment, Timeouts(connect=2.0), UpstreamSettings())
    await upstream.start()
    try:
        response = await upstream.post(CHAT)
        assert await response.read() == b'{"ok":true}'
        response.release()
        return response.status
    finally:
        await upstream.close()


async def test_a_deployments_own_ca_reaches_a_privately_signed_upstream(
    pki: Pki, servers: list[OkServer]
) -> None:
    port = await tls_server(servers, pki)
    assert await call(port, {"ca_file": str(pki.ca)}) == 200
    with pytest.raises(Failure):
        await call(port)  # the system trust store does not know the private CA


async def test_the_ca_file_replaces_the_system_store(pki: Pki, servers: list[OkServer]) -> None:
    """A deployment pinned to one CA does not accept a certificate another CA signed."""
    port = await tls_server(servers, pki)
    with pytest.raises(Failure):
        await call(port, {"ca_file": str(pki.client_ca)})


async def test_the_client_certificate_is_presented(pki: Pki, servers: list[OkServer]) -> None:
    port = await tls_server(servers, pki, require_client=True)
    mtls = {
        "ca_file": str(pki.ca),
        "client_cert": str(pki.client_cert),
        "client_key": str(pki.client_key),
    }
    assert await call(port, mtls) == 200
    assert servers[0].peer_subjects == ["ballast-client"]
    with pytest.raises(Failure):
        await call(port, {"ca_file": str(pki.ca)})  # no client certificate: refused


async def test_verify_false_accepts_any_certificate_and_says_so(
    pki: Pki, servers: list[OkServer], caplog: pytest.LogCaptureFixture
) -> None:
    port = await tls_server(servers, pki)
    with caplog.at_level(logging.WARNING, logger="ballast.upstream"):
        assert await call(port, {"verify": False}) == 200
    assert any(
        "private" in r.getMessage() and "not verified" in r.getMessage() for r in caplog.records
    )


def test_an_unreadable_tls_file_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    data: dict[str, Any] = {
        "models": [
            {
                "name": "m",
                "deployments": [
                    {"id": "private", "url": "https://h/v1", "tls": {"ca_file": str(missing)}}
                ],
            }
        ]
    }
    with pytest.raises(ConfigError) as caught:
        parse_settings(data)
    assert "'private'" in str(caught.value) and "tls.ca_file" in str(caught.value)
    with pytest.raises(ConfigError, match=r"client_key needs tls\.client_cert"):
        data["models"][0]["deployments"][0]["tls"] = {"client_key": str(missing)}
        parse_settings(data)


async def test_a_file_that_is_not_pem_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for field in ("ca_file", "client_cert"):
        deployment = Deployment.model_validate(
            {"id": "private", "url": "https://127.0.0.1:1/v1", "tls": {field: str(junk)}}
        )
        upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
        with pytest.raises(ConfigError) as caught:
            await upstream.start()
        assert f"'private': tls.{field}" in str(caught.value)


async def test_the_context_is_built_once_per_deployment(pki: Pki, servers: list[OkServer]) -> None:
    port = await tls_server(servers, pki)
    deployment = Deployment.model_validate(
        {"id": "private", "url": f"https://127.0.0.1:{port}/v1", "tls": {"ca_file": str(pki.ca)}}
    )
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    await upstream.start()
    assert upstream._pool is not None
    context = upstream._pool._ssl
    assert context is not None
    for _ in range(2):
        response = await upstream.post(CHAT)
        await response.read()
        response.release()
    assert upstream._pool._ssl is context and servers[0].connections == 1
    await upstream.close()

"""Cloud credentials never stall the event loop: Bedrock's credential chain is resolved and
refreshed in a worker thread while calls go on signing with the current keys, and each
signature is botocore's own over the final bytes; Vertex access tokens come from one fetch
for concurrent calls, and a 401 renews the token once and retries once."""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials, RefreshableCredentials  # type: ignore[import-untyped]

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.providers.base import AdapterContext
from ballast.providers.bedrock import BedrockAdapter
from ballast.providers.vertex import VertexAdapter
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.client import Route, Upstream

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
BODY = b'{"messages":[]}'


def _bedrock() -> BedrockAdapter:
    deployment = Deployment(
        id="bed", url="https://bedrock-runtime.us-east-1.amazonaws.com", model=MODEL,
        provider="bedrock", aws={"region": "us-east-1"},
    )  # fmt: skip
    return BedrockAdapter(
        deployment, Upstream(deployment, Timeouts(), UpstreamSettings()), AdapterContext()
    )


class _Call:
    def __init__(self) -> None:
        self.path = "/chat/completions"
        self.payload: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
        self.raw = b""
        self.model = "chat"
        self.edits: dict[str, Any] = {}
        self.credential = "c"
        self.request_id: str | None = None
        self.forwarded: tuple[tuple[str, str], ...] = ()
        self.bridge = None
        self.extended = False


def _lines(headers: bytes) -> dict[str, str]:
    pairs = [line.split(": ", 1) for line in headers.decode().split("\r\n") if line]
    return {name: value for name, value in pairs}


async def test_a_bedrock_signature_is_botocores_over_the_final_bytes() -> None:
    adapter = _bedrock()
    adapter._credentials = Credentials("AKIDTEST", "secret", "session-token")
    adapter._frozen = adapter._credentials.get_frozen_credentials()
    adapter._signer, adapter._request = SigV4Auth, AWSRequest
    wire = adapter.wire(_Call(), "chat", BODY, stream=True)
    assert wire.target == "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    sent = _lines(wire.headers)
    assert sent["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "/us-east-1/bedrock/aws4_request" in sent["authorization"]
    assert sent["x-amz-security-token"] == "session-token"
    # botocore's own signing steps at the same instant give the same signature.
    request = AWSRequest(
        "POST",
        "https://bedrock-runtime.us-east-1.amazonaws.com" + wire.target,
        data=BODY,
        headers={"content-type": "application/json"},
    )
    request.context["timestamp"] = sent["x-amz-date"]
    request.headers["X-Amz-Date"] = sent["x-amz-date"]
    request.headers["X-Amz-Security-Token"] = "session-token"
    signer = SigV4Auth(adapter._frozen, "bedrock", "us-east-1")
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    assert sent["authorization"].endswith(f"Signature={signature}")
    other = _lines(adapter.wire(_Call(), "chat", BODY + b" ", stream=True).headers)
    assert other["authorization"] != sent["authorization"]  # the body is signed


async def test_bedrock_credentials_refresh_in_a_thread_while_calls_go_on() -> None:
    loop_thread = threading.get_ident()
    refreshed_in: list[int] = []
    release = threading.Event()
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=120)

    def refresh() -> dict[str, str]:
        refreshed_in.append(threading.get_ident())
        release.wait(5)
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {"access_key": "AKIDNEW", "secret_key": "s2", "token": "t2",
                "expiry_time": later.isoformat()}  # fmt: skip

    adapter = _bedrock()
    credentials = RefreshableCredentials("AKIDOLD", "s1", "t1", soon, refresh, "test")
    adapter._credentials = credentials
    adapter._frozen = Credentials("AKIDOLD", "s1", "t1").get_frozen_credentials()
    adapter._signer, adapter._request = SigV4Auth, AWSRequest
    first = _lines(adapter.wire(_Call(), "chat", BODY, stream=False).headers)
    assert "Credential=AKIDOLD/" in first["authorization"]  # signed now, refresh under way
    second = _lines(adapter.wire(_Call(), "chat", BODY, stream=False).headers)
    assert "Credential=AKIDOLD/" in second["authorization"]  # one refresh, not one per call
    release.set()
    assert adapter._refresh is not None
    await asyncio.wait_for(adapter._refresh, 5)
    assert refreshed_in and loop_thread not in refreshed_in
    assert len(refreshed_in) == 1
    third = _lines(adapter.wire(_Call(), "chat", BODY, stream=False).headers)
    assert "Credential=AKIDNEW/" in third["authorization"]
    await adapter.close()


async def test_bedrock_without_credentials_is_an_auth_failure_not_a_crash() -> None:
    adapter = _bedrock()
    adapter._signer, adapter._request = SigV4Auth, AWSRequest
    adapter._chain = lambda: (_ for _ in ()).throw(LookupError("none"))  # type: ignore[method-assign]
    with pytest.raises(Failure) as caught:
        adapter.wire(_Call(), "chat", BODY, stream=False)
    assert caught.value.kind is failures.UPSTREAM_AUTH
    assert adapter._refresh is not None
    await asyncio.gather(adapter._refresh, return_exceptions=True)


def _vertex() -> VertexAdapter:
    deployment = Deployment(
        id="vx", url="https://us-central1-aiplatform.googleapis.com", model="gemini-2.0-flash",
        provider="vertex", google={"project": "p", "location": "us-central1"},
    )  # fmt: skip
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    return VertexAdapter(deployment, upstream, AdapterContext())


async def test_concurrent_vertex_calls_share_one_token_fetch() -> None:
    adapter = _vertex()
    fetched: list[int] = []
    gate = threading.Event()

    def fetch() -> tuple[str, float]:
        fetched.append(threading.get_ident())
        gate.wait(5)
        return f"token-{len(fetched)}", adapter.context.clock.time() + 3600

    adapter._fetch_token = fetch  # type: ignore[method-assign]
    seen: list[str] = []

    async def send(route: Route | None) -> str:
        assert route is not None
        seen.append(route.token)
        return "ok"

    calls = [adapter.routed(_Call(), "chat", send) for _ in range(8)]
    await asyncio.sleep(0.05)
    gate.set()
    assert await asyncio.gather(*calls) == ["ok"] * 8
    assert len(fetched) == 1 and threading.get_ident() not in fetched
    assert seen == ["token-1"] * 8
    await adapter.close()


async def test_a_vertex_401_renews_once_and_retries_once() -> None:
    adapter = _vertex()
    issued = iter(["t1", "t2", "t3"])
    adapter._fetch_token = lambda: (next(issued), adapter.context.clock.time() + 3600)  # type: ignore[method-assign]
    tried: list[str] = []

    async def refused(route: Route | None) -> str:
        assert route is not None
        tried.append(route.token)
        raise Failure(failures.UPSTREAM_AUTH, "401", status=401)

    with pytest.raises(Failure):
        await adapter.routed(_Call(), "chat", refused)
    assert tried == ["t1", "t2"]  # renewed once, retried once, then the answer stands

    async def ok_on_fresh(route: Route | None) -> str:
        assert route is not None
        tried.append(route.token)
        return route.token

    assert await adapter.routed(_Call(), "chat", ok_on_fresh) == "t2"  # the renewed one is kept
    await adapter.close()


def test_the_cloud_credential_libraries_load_only_for_a_deployment_that_needs_them() -> None:
    """A gateway without Bedrock or Vertex deployments never imports botocore or google-auth
    (their import costs start-up time and memory in every worker)."""
    code = (
        "import sys, ballast.app, ballast.providers, ballast.cli\n"
        "loaded = [m for m in ('botocore', 'google.auth', 'google.oauth2') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()

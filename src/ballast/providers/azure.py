"""Azure OpenAI: the OpenAI wire on Azure's URLs, with Azure's credential header.

Two URL styles: the classic `/openai/deployments/{deployment}/chat/completions?api-version=`
(the deployment named in the path), and the `/openai/v1/` API (the model named in the body,
as on OpenAI). The key goes as the `api-key` header, or as a bearer token (a Microsoft Entra
access token configured as the key). Bodies, answers and streams are OpenAI's, so nothing
is translated; Azure's content-filter refusals (400 `content_filter`, or an answer that
ends with `finish_reason: content_filter`) and its Retry-After already fit the taxonomy."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from ballast.config import AzureOptions, Deployment
from ballast.providers.base import Adapter, AdapterContext, OutboundCall
from ballast.upstream.client import Upstream
from ballast.upstream.http1 import header_lines
from ballast.upstream.provider_wire import Wire


class AzureAdapter(Adapter):
    name: ClassVar[str] = "azure"

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self.options = options = deployment.azure or AzureOptions()
        key = deployment.api_key
        configured = {name.lower() for name in deployment.headers}
        self._own_auth = options.auth == "api-key"
        self._headers = b""
        if self._own_auth and key is not None and "api-key" not in configured:
            self._headers = header_lines({"api-key": key.get_secret_value()})
        query = f"?api-version={quote(options.api_version)}" if options.api_version else ""
        self._query = query
        self._prefix = "/openai/v1"  # the URL is the resource's endpoint (config/deployment.py)
        self._wires: dict[tuple[str, str], Wire] = {}  # (path, model) -> its wire, made once

    def _deployment_prefix(self, model: str) -> str:
        name = self.options.deployment or self.upstream_model(model)
        return f"/openai/deployments/{quote(name, safe='')}"

    def wire(
        self,
        call: OutboundCall,
        model: str,
        body: bytes,
        stream: bool,
        prefill: str | None = None,
    ) -> Wire:
        """The same few wires serve every call: they hold no per-call state."""
        key = (call.path, model)
        wire = self._wires.get(key)
        if wire is None:
            prefix = self._prefix if self.options.style == "v1" else self._deployment_prefix(model)
            wire = Wire(prefix + call.path + self._query, self._headers, own_auth=self._own_auth)
            if len(self._wires) < 1024:
                self._wires[key] = wire
        return wire

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire:
        return Wire("", self._headers, own_auth=self._own_auth)

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """The OpenAI probe on Azure's paths: a one-token completion of the deployment, or
        the model list."""
        request = super().probe_request()
        if request is None:
            return None
        method, path, body = request
        if self.options.style == "v1":
            return method, self._prefix + path + self._query, body
        if path == "/models":
            return method, "/openai/models" + self._query, body
        body = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        return "POST", self._deployment_prefix("") + "/chat/completions" + self._query, body

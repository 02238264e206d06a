"""Anthropic's Messages API: `x-api-key` and `anthropic-version` headers. A chat request is
translated (anthropic_request.py) and the answer, stream and errors translated back
(anthropic_wire.py); Messages goes on from an assistant prefill natively, so a chat stream
cut mid-answer is continued, not regenerated. A Messages request to a deployment that
serves it natively (`messages: native`, the default) goes as the client sent it, with the
`anthropic-version` and `anthropic-beta` it sent, and comes back untouched; so does a
count_tokens request (`count_wire`)."""

from __future__ import annotations

from typing import Any, ClassVar

from ballast.config import AnthropicOptions, Deployment
from ballast.providers.anthropic_request import Untranslatable, messages_request
from ballast.providers.anthropic_wire import AnthropicWire, NativeWire
from ballast.providers.base import Adapter, AdapterContext, Capabilities, OutboundCall
from ballast.providers.native import NativeAdapter
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.client import Upstream
from ballast.upstream.http1 import header_lines
from ballast.upstream.provider_wire import Wire

_PING = {"role": "user", "content": "ping"}


class AnthropicAdapter(NativeAdapter):
    name: ClassVar[str] = "anthropic"
    extensions: ClassVar[frozenset[str]] = frozenset(("cache_control", "thinking"))

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self.options = deployment.anthropic or AnthropicOptions()
        # Messages continues a prefill unless the deployment says its model refuses one.
        self.capabilities = Capabilities(prefill=deployment.supports_prefill is not False)
        headers = {"anthropic-version": self.options.version}
        if deployment.api_key is not None:
            headers["x-api-key"] = deployment.api_key.get_secret_value()
        if self.options.beta is not None:
            headers["anthropic-beta"] = self.options.beta
        # A configured header of the same name wins (the Upstream sends those on every call).
        configured = {name.lower() for name in deployment.headers}
        self._configured = configured
        self._own = {k: v for k, v in headers.items() if k not in configured}
        self._headers = header_lines(self._own)
        self._native = deployment.messages_mode == "native"
        self._wires: dict[tuple[tuple[str, str], ...], NativeWire] = {}  # by forwarded headers
        # Deployment URLs are written as the API's root, with or without its /v1.
        self._target = "/messages" if deployment.url.endswith("/v1") else "/v1/messages"

    def speaks(self, path: str) -> bool:
        return self._native or path != "/messages"

    def body(self, call: OutboundCall, model: str, prefill: str | None = None) -> bytes:
        if call.path == "/messages":  # native: the client's bytes, the model name rewritten
            return Adapter.body(self, call, model)
        return super().body(call, model, prefill)

    def _native_wire(self, call: OutboundCall) -> NativeWire:
        """The wire of a native Messages request: one per set of forwarded headers, since
        clients send the same few values over and over."""
        given = call.forwarded
        wire = self._wires.get(given)
        if wire is None:
            if len(self._wires) >= 256:
                self._wires.clear()
            wire = self._wires[given] = NativeWire(self._target, self._native_headers(given))
        return wire

    def _native_headers(self, given: tuple[tuple[str, str], ...]) -> bytes:
        """The deployment's headers with the client's `anthropic-version` and
        `anthropic-beta` (the deployment's betas kept beside the client's)."""
        if not given:
            return self._headers
        headers = dict(self._own)
        for name, value in given:
            if name in self._configured:
                continue
            own = headers.get(name)
            if name == "anthropic-beta" and own is not None and own != value:
                value = f"{value},{own}"
            headers[name] = value
        return header_lines(headers)

    def translate(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        try:
            return messages_request(payload, model, self.options.max_tokens)
        except Untranslatable as exc:
            raise Failure(failures.UNSUPPORTED, str(exc)) from None

    def apply_prefill(self, call: OutboundCall, payload: dict[str, Any], text: str) -> None:
        """The text as a final assistant turn (Messages refuses one that ends in white space:
        the answer's own white space comes back, see the wire's `trim`)."""
        payload["messages"] = [
            *payload["messages"],
            {"role": "assistant", "content": text.rstrip()},
        ]

    def wire(
        self,
        call: OutboundCall,
        model: str,
        body: bytes,
        stream: bool,
        prefill: str | None = None,
    ) -> Wire:
        if call.path == "/messages":
            return self._native_wire(call)
        options = call.edits.get("stream_options") or call.payload.get("stream_options")
        usage_wanted = isinstance(options, dict) and bool(options.get("include_usage"))
        created = int(self.context.clock.time())
        trim = prefill is not None and prefill != prefill.rstrip()
        trim = trim and self.continues(call, prefill or "")
        return AnthropicWire(
            self._target, self._headers, self.upstream_model(model), created, usage_wanted, trim
        )

    def count_wire(self, call: OutboundCall) -> Wire | None:
        """Anthropic's own count (`/v1/messages/count_tokens`), asked as a native Messages
        request is: with the client's `anthropic-version` and `anthropic-beta`."""
        if not self._native:
            return None
        return NativeWire(self._target + "/count_tokens", self._native_headers(call.forwarded))

    def continues(self, call: OutboundCall, prefill: str) -> bool:
        """Messages goes on from a prefill, except with extended thinking on (it answers 400
        to a final assistant turn that does not open with a thinking block) or one that is
        only white space (sent without it, nothing would be left): regenerated instead."""
        return bool(prefill.rstrip()) and super().continues(call, prefill)

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire:
        return Wire(self._target, self._headers)

    def probe_path(self, model: str) -> str:
        return self._target

    def probe_body(self) -> dict[str, Any]:
        return {"model": self.deployment.model, "max_tokens": 1, "messages": [_PING]}

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """A one-token message when the deployment names its model, else the model list."""
        probe = super().probe_request()
        if probe is not None or self.deployment.probe == "none":
            return probe
        return "GET", self._target.replace("/messages", "/models"), None

"""What the adapters of providers with their own format share: the chat request with every
edit applied, translated once into the provider's body, and a Wire whose answers, streams
and errors come back as chat. Only chat completions have a native translation."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import orjson

import ballast.providers.chat_shapes as cs
from ballast.providers.base import Adapter, OutboundCall, edited
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.provider_wire import Wire
from ballast.upstream.sse import DONE

Ids = tuple[str, int, str]
Chunks = list[dict[str, Any]]


class NativeAdapter(Adapter, ABC):
    """Base of the Anthropic, Gemini, Vertex and Bedrock adapters: subclasses say
    `translate` (chat payload -> provider body) and build their Wire."""

    @abstractmethod
    def translate(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        """The chat payload (edits and any prefill applied) as the provider's request body;
        `model` is the name the deployment knows the model by."""

    def body(self, call: OutboundCall, model: str, prefill: str | None = None) -> bytes:
        if call.path != "/chat/completions":
            raise cs.unsupported(
                f"a {self.name} deployment answers chat completions, not {call.path}"
            )
        payload = edited(call)
        if prefill is not None and self.continues(call, prefill):
            self.apply_prefill(call, payload, prefill)
        return orjson.dumps(self.translate(payload, self.upstream_model(model)))

    def continues(self, call: OutboundCall, prefill: str) -> bool:
        """Only a chat is continued here: there is no text completion to grow."""
        return call.path == "/chat/completions" and super().continues(call, prefill)

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """A one-token request in the provider's own wire, when the deployment names its
        model (there is no model list to fall back on); None: not probed."""
        model = self.deployment.model
        if self.deployment.probe == "none" or model is None or model == "*":
            return None
        return "POST", self.probe_path(model), self.probe_body()

    @abstractmethod
    def probe_path(self, model: str) -> str:
        """The path of a one-token request to `model`."""

    @abstractmethod
    def probe_body(self) -> dict[str, Any]:
        """The body of that one-token request."""

    def ids(self, model: str) -> Ids:
        """The id, creation time and model of one translated answer."""
        created = int(self.context.clock.time())
        return f"chatcmpl-{uuid.uuid4().hex}", created, self.upstream_model(model)


def include_usage(call: OutboundCall) -> bool:
    """Whether the stream ends with a usage chunk (the client or the gateway asked)."""
    options = call.edits.get("stream_options", call.payload.get("stream_options"))
    return isinstance(options, dict) and options.get("include_usage") is True


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk)


class ChatWire(Wire):
    """A Wire whose native answer and stream are translated by a provider's functions."""

    __slots__ = ("_ids", "_parse_error", "_usage", "_whole")

    def __init__(
        self,
        target: str,
        headers: bytes,
        ids: Ids,
        usage: bool,
        whole: Callable[[Any, Ids], dict[str, Any]],
        parse_error: Callable[[int, bytes, tuple[tuple[bytes, bytes], ...], float | None], Failure],
    ) -> None:
        super().__init__(target, headers)
        self._ids = ids
        self._usage = usage
        self._whole = whole
        self._parse_error = parse_error

    def answer(self, data: bytes) -> tuple[bytes, dict[str, Any]]:
        payload = self._whole(orjson.loads(data), self._ids)  # JSONDecodeError: a ValueError
        return orjson.dumps(payload), payload

    def failure(
        self,
        status: int,
        body: bytes,
        headers: tuple[tuple[bytes, bytes], ...],
        retry_after: float | None,
        deployment: str,
    ) -> Failure:
        failure = self._parse_error(status, body, headers, retry_after)
        failure.deployment = deployment
        failure.headers = headers
        return failure


class Deferred:
    """An in-band error held back until the events decoded before it are out (the Decoder
    contract: those are the client's). `run` decodes; a Failure after some events is kept
    and raised by the next call."""

    __slots__ = ("_failure",)

    def __init__(self) -> None:
        self._failure: Failure | None = None

    def run(self, decode: Callable[[list[bytes]], None]) -> list[bytes]:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        out: list[bytes] = []
        try:
            decode(out)
        except Failure as failure:
            if not out:
                raise
            self._failure = failure
        return out


def closing(finished: bool, rest: Chunks) -> list[bytes]:
    """What ends a finished stream: its last chunks and [DONE]."""
    return [*(event(c) for c in rest), DONE] if finished else []


def malformed(provider: str) -> Failure:
    return cs.failure(failures.BAD_RESPONSE, f"{provider} sent a stream event that is not JSON")

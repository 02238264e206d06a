"""Google Gemini on AI Studio: the key in `x-goog-api-key`, the model in the path
(`/v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`)."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import orjson

import ballast.providers.gemini_answer as gemini_answer
from ballast.config import Deployment
from ballast.providers.base import AdapterContext, OutboundCall
from ballast.providers.gemini_answer import GeminiStream
from ballast.providers.gemini_request import gemini_body
from ballast.providers.native import (
    ChatWire,
    Deferred,
    Ids,
    NativeAdapter,
    closing,
    event,
    include_usage,
)
from ballast.providers.native import malformed as malformed_event
from ballast.resilience.failures import Failure
from ballast.upstream.client import Upstream
from ballast.upstream.provider_wire import Decoder, Wire
from ballast.upstream.sse import MAX_EVENT_BYTES, SseSplitter, event_data


def _parse_error(
    status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...], retry_after: float | None
) -> Failure:
    return gemini_answer.parse_error(status, body, retry_after)


class GeminiDecoder:
    """Gemini's SSE stream of whole GenerateContentResponses, as chat SSE events."""

    __slots__ = ("_held", "_sse", "_stream", "_usage")

    def __init__(self, ids: Ids, usage: bool, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._sse = SseSplitter(max_event_bytes)
        self._stream = GeminiStream(ids)
        self._usage = usage
        self._held = Deferred()

    def feed(self, data: bytes) -> list[bytes]:
        return self._held.run(lambda out: self._decode(self._sse.feed(data), out))

    def finish(self) -> list[bytes]:
        def rest(out: list[bytes]) -> None:
            self._decode(self._sse.finish(), out)
            out += closing(self._stream.finished, self._stream.end(self._usage))

        return self._held.run(rest)

    def _decode(self, raws: list[bytes], out: list[bytes]) -> None:
        for raw in raws:
            data = event_data(raw)
            if data is None:
                continue
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise malformed_event("Gemini") from None
            out += [event(chunk) for chunk in self._stream.feed(payload)]


class GeminiWire(ChatWire):
    __slots__ = ()

    def decoder(self, max_event_bytes: int = MAX_EVENT_BYTES) -> Decoder:
        return GeminiDecoder(self._ids, self._usage, max_event_bytes)


class GeminiAdapter(NativeAdapter):
    name: ClassVar[str] = "gemini"
    api_version: ClassVar[str] = "v1beta"

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        key = deployment.api_key.get_secret_value() if deployment.api_key is not None else ""
        self._auth = f"x-goog-api-key: {key}\r\n".encode("latin-1") if key else b""

    def translate(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        return gemini_body(payload)

    def probe_path(self, model: str) -> str:
        return self.model_path(model) + ":generateContent"

    def probe_body(self) -> dict[str, Any]:
        ping = {"role": "user", "parts": [{"text": "ping"}]}
        return {"contents": [ping], "generationConfig": {"maxOutputTokens": 1}}

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire:
        return Wire("", self._auth)

    def model_path(self, model: str) -> str:
        return f"/{self.api_version}/models/{quote(self.upstream_model(model), safe='')}"

    def wire(
        self,
        call: OutboundCall,
        model: str,
        body: bytes,
        stream: bool,
        prefill: str | None = None,
    ) -> GeminiWire:
        method = ":streamGenerateContent?alt=sse" if stream else ":generateContent"
        return GeminiWire(
            self.model_path(model) + method,
            self._auth,
            self.ids(model),
            include_usage(call),
            gemini_answer.whole,
            _parse_error,
        )

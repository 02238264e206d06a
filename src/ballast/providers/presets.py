"""OpenAI-compatible providers known by name (`provider: mistral`, `groq`, ...): the OpenAI
wire, with the base URL filled in at load (an explicit `url` wins, config.PRESETS) and the
provider's known quirks kept here, such as refusing `stream_options`."""

from __future__ import annotations

from typing import Any, ClassVar

from ballast.config import PRESETS, Deployment, Preset
from ballast.providers.base import Adapter, AdapterContext, OutboundCall
from ballast.upstream.client import Upstream


class PresetAdapter(Adapter):
    name: ClassVar[str] = "preset"

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self.preset: Preset = PRESETS[deployment.provider]

    def body(self, call: OutboundCall, model: str, prefill: str | None = None) -> bytes:
        if not self.preset.stream_options and (
            "stream_options" in call.payload or call.edits.get("stream_options") is not None
        ):
            call = _WithoutStreamOptions(call)
        return super().body(call, model, prefill)


class _WithoutStreamOptions:
    """A call whose `stream_options` is left out (the provider refuses the field; it sends
    the usage at the end of a stream anyway)."""

    __slots__ = ("_call", "edits")

    def __init__(self, call: OutboundCall) -> None:
        self._call = call
        self.edits: dict[str, Any] = {**call.edits, "stream_options": None}

    @property
    def path(self) -> str:
        return self._call.path

    @property
    def payload(self) -> dict[str, Any]:
        return self._call.payload

    @property
    def raw(self) -> bytes:
        return self._call.raw

    @property
    def model(self) -> str:
        return self._call.model

    @property
    def credential(self) -> str:
        return self._call.credential

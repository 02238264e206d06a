"""OpenAI-compatible providers known by name (`provider: mistral`, `groq`, ...): the OpenAI
wire, with the base URL filled in at load (an explicit `url` wins, config.PRESETS) and the
provider's known quirks kept here, such as refusing `stream_options`."""

from __future__ import annotations

from typing import ClassVar

from ballast.config import PRESETS, Deployment, Preset
from ballast.providers.base import Adapter, AdapterContext, EditedCall, OutboundCall
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
            call = EditedCall(call, {**call.edits, "stream_options": None})
        return super().body(call, model, prefill)

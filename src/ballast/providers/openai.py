"""OpenAI-compatible upstreams: OpenAI itself and every provider that speaks its wire, and the
self-hosted servers (vLLM, SGLang) that also continue an assistant prefill on request."""

from __future__ import annotations

from typing import Any, ClassVar

from ballast.providers.base import Adapter, OutboundCall


class OpenAIAdapter(Adapter):
    name: ClassVar[str] = "openai"


class VllmAdapter(Adapter):
    """vLLM and SGLang: a prefill is continued only when the request says so."""

    name: ClassVar[str] = "vllm"

    def apply_prefill(self, call: OutboundCall, payload: dict[str, Any], text: str) -> None:
        super().apply_prefill(call, payload, text)
        if call.path == "/chat/completions":
            payload["continue_final_message"] = True
            payload["add_generation_prompt"] = False

"""One adapter per upstream protocol, behind the interface in `base.py`. `ADAPTERS` maps a
deployment's `provider` to its adapter, for every name in the config's provider catalogue
(`config/catalogue.py`, which the config validates against) and for nothing else; adding a
provider means one module here, its name in the catalogue and in this table, and the
simulator speaking its wire."""

from __future__ import annotations

from ballast.config.catalogue import PRESETS
from ballast.providers.actor import ActorAdapter
from ballast.providers.anthropic import AnthropicAdapter
from ballast.providers.azure import AzureAdapter
from ballast.providers.base import Adapter, AdapterContext, Capabilities, OutboundCall
from ballast.providers.bedrock import BedrockAdapter
from ballast.providers.gemini import GeminiAdapter
from ballast.providers.openai import OpenAIAdapter, VllmAdapter
from ballast.providers.presets import PresetAdapter
from ballast.providers.vertex import VertexAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    "openai": OpenAIAdapter,
    "vllm": VllmAdapter,
    "sglang": VllmAdapter,
    "actor": ActorAdapter,
    "anthropic": AnthropicAdapter,
    "azure": AzureAdapter,
    **dict.fromkeys(PRESETS, PresetAdapter),
    "gemini": GeminiAdapter,
    "vertex": VertexAdapter,
    "bedrock": BedrockAdapter,
}

__all__ = ["ADAPTERS", "Adapter", "AdapterContext", "Capabilities", "OutboundCall"]

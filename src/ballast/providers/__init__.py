"""One adapter per upstream protocol, behind the interface in `base.py`. `ADAPTERS` maps a
deployment's `provider` to its adapter; adding a provider means one module here, its name in
this table and in the config's `provider` field, and the simulator speaking its wire."""

from __future__ import annotations

from ballast.config import PRESETS
from ballast.providers.actor import ActorAdapter
from ballast.providers.anthropic import AnthropicAdapter
from ballast.providers.azure import AzureAdapter
from ballast.providers.base import Adapter, AdapterContext, Capabilities, OutboundCall
from ballast.providers.openai import OpenAIAdapter, VllmAdapter
from ballast.providers.presets import PresetAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    "openai": OpenAIAdapter,
    "vllm": VllmAdapter,
    "sglang": VllmAdapter,
    "actor": ActorAdapter,
    "anthropic": AnthropicAdapter,
    "azure": AzureAdapter,
    **dict.fromkeys(PRESETS, PresetAdapter),
}

__all__ = ["ADAPTERS", "Adapter", "AdapterContext", "Capabilities", "OutboundCall"]

"""The provider catalogue: every name a deployment's `provider` takes, with the URL a
deployment of it gets when it names none."""

from __future__ import annotations

from typing import Literal, NamedTuple


class Preset(NamedTuple):
    """An OpenAI-compatible provider known by name: its base URL and its quirks."""

    url: str
    stream_options: bool = True  # False: the provider refuses `stream_options`


PRESETS: dict[str, Preset] = {
    "mistral": Preset("https://api.mistral.ai/v1", stream_options=False),
    "groq": Preset("https://api.groq.com/openai/v1"),
    "deepseek": Preset("https://api.deepseek.com/v1"),
    "together": Preset("https://api.together.xyz/v1"),
    "fireworks": Preset("https://api.fireworks.ai/inference/v1"),
    "openrouter": Preset("https://openrouter.ai/api/v1"),
    "xai": Preset("https://api.x.ai/v1"),
    "ollama": Preset("http://localhost:11434/v1"),
    "perplexity": Preset("https://api.perplexity.ai", stream_options=False),
    "cerebras": Preset("https://api.cerebras.ai/v1"),
    "nvidia": Preset("https://integrate.api.nvidia.com/v1"),
}
# Every name `provider` takes: the native protocols, then the presets above.
ProviderName = Literal[
    "openai",
    "vllm",
    "sglang",
    "actor",
    "anthropic",
    "azure",
    "gemini",
    "vertex",
    "bedrock",
    "mistral",
    "groq",
    "deepseek",
    "together",
    "fireworks",
    "openrouter",
    "xai",
    "ollama",
    "perplexity",
    "cerebras",
    "nvidia",
]
DEFAULT_URLS = {
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    **{k: p.url for k, p in PRESETS.items()},
}

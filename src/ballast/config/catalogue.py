"""The provider catalogue: every name a deployment's `provider` takes, listed once.

The adapters' registry (`ballast.providers.ADAPTERS`) maps these names to adapters; it
imports the config, so the names live here and a unit test holds the two equal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple


class Preset(NamedTuple):
    """An OpenAI-compatible provider known by name: its base URL and its quirks."""

    url: str
    stream_options: bool = True  # False: the provider refuses `stream_options`


# The native protocols, each with the URL a deployment of it gets when it names none
# (Bedrock's and Vertex's follow from their region or location instead).
NATIVE: dict[str, str | None] = {
    "openai": None,
    "vllm": None,
    "sglang": None,
    "actor": None,
    "anthropic": "https://api.anthropic.com",
    "azure": None,
    "gemini": "https://generativelanguage.googleapis.com",
    "vertex": None,
    "bedrock": None,
}
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
# Every name `provider` takes: the native protocols, then the presets.
PROVIDERS: tuple[str, ...] = (*NATIVE, *PRESETS)
DEFAULT_URLS: dict[str, str] = {
    **{name: url for name, url in NATIVE.items() if url is not None},
    **{name: preset.url for name, preset in PRESETS.items()},
}

# Validation (and its error, which lists the names) needs a Literal; a type checker cannot
# build one from a tuple, so it sees the plain string the value is.
if TYPE_CHECKING:
    ProviderName = str
else:
    ProviderName = Literal[PROVIDERS]

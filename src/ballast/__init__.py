"""Ballast: a self-healing, OpenAI-compatible LLM gateway."""

__version__ = "0.1.0"

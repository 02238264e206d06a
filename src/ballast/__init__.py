"""Ballast: a self-healing, OpenAI-compatible LLM gateway."""

from importlib.metadata import PackageNotFoundError, version

# The version is written once, in pyproject.toml; the installed package's metadata carries it.
try:
    __version__ = version("ballast")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

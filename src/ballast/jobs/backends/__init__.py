"""Job backends by protocol; `build` makes one from its settings."""

from __future__ import annotations

from ballast.config import JobBackendSettings
from ballast.jobs.backends.base import JobBackend
from ballast.jobs.backends.http import GenericHttpBackend
from ballast.jobs.backends.replicate import ReplicateBackend
from ballast.jobs.backends.runpod import RunPodBackend


def build(name: str, settings: JobBackendSettings, instance: str = "") -> JobBackend:
    if settings.protocol == "runpod":
        return RunPodBackend(name, settings, instance)
    if settings.protocol == "replicate":
        return ReplicateBackend(name, settings, instance)
    return GenericHttpBackend(name, settings, instance)

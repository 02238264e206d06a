"""OpenTelemetry spans per request and per upstream attempt. Optional: off unless
`observe.tracing` is set and the `opentelemetry` packages are installed; when off, the hot
path pays one `is None` check."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("ballast.tracing")


class Tracer:
    def __init__(self, tracer: Any, status: Any, status_code: Any) -> None:
        self._tracer = tracer
        self._status = status
        self._error = status_code.ERROR

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        with self._tracer.start_as_current_span(name, record_exception=False) as span:
            for key, value in attributes.items():
                if value is not None:
                    span.set_attribute(f"ballast.{key}", value)
            try:
                yield span
            except BaseException as exc:
                label = getattr(getattr(exc, "kind", None), "label", type(exc).__name__)
                span.set_status(self._status(self._error, str(label)))
                span.set_attribute("ballast.outcome", str(label))
                raise


def build_tracer(enabled: bool) -> Tracer | None:
    """The tracer, or None when tracing is off or OpenTelemetry is not installed."""
    if not enabled:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        log.warning("observe.tracing is on but opentelemetry is not installed; tracing is off")
        return None
    return Tracer(trace.get_tracer("ballast"), Status, StatusCode)

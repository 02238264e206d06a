"""OpenTelemetry spans per request and per upstream attempt, exported by Ballast itself.

Tracing is on with `observe.tracing: true` or when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its
traces-only twin) is set, and needs the tracing extra. Unless something else already set
a tracer provider (`opentelemetry-instrument`, a test), Ballast sets up one per process:
an OTLP/HTTP exporter behind a batch processor, which read the standard variables
themselves (`OTEL_EXPORTER_OTLP_*ENDPOINT`, `_HEADERS`, `_TIMEOUT`, `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`); `OTEL_TRACES_EXPORTER`
may say `console` or `none`, and `OTEL_SDK_DISABLED=true` turns it all off. When off, the
hot path pays one `is None` check."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from ballast.config import mask_url

log = logging.getLogger("ballast.tracing")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_configured: bool | None = None  # this process's provider: set up, or found unusable


class Tracer:
    def __init__(self, tracer: Any, status: Any, status_code: Any, propagator: Any) -> None:
        self._tracer = tracer
        self._status = status
        self._error = status_code.ERROR
        self._propagator = propagator  # W3C trace context, whatever the global one is

    def incoming(self, headers: Iterable[tuple[bytes, bytes]]) -> Any:
        """The client's trace context (W3C `traceparent`, `tracestate`), for the request's
        span to join its trace; None when the client sent none."""
        carrier = {}
        for name, value in headers:
            if name == b"traceparent" or name == b"tracestate":
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        return self._propagator.extract(carrier) if carrier else None

    def outgoing(self) -> bytes:
        """The current span's trace context as header lines for the upstream, so its spans
        (a self-hosted model server's) join the same trace."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return "".join(f"{name}: {value}\r\n" for name, value in carrier.items()).encode(
            "latin-1", "replace"
        )

    @contextlib.contextmanager
    def span(self, name: str, parent: Any = None, **attributes: Any) -> Iterator[Any]:
        """A span under the current one, or under `parent` (a context from `incoming`)."""
        started = self._tracer.start_as_current_span(name, parent, record_exception=False)
        with started as span:
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

    @staticmethod
    def annotate(span: Any, attributes: Mapping[str, Any]) -> None:
        """Attributes under their own names (the GenAI semantic conventions'); None skipped."""
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)


def tracing_source(enabled: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """What turns tracing on: the setting, or the variable that is set; None when off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if enabled:
        return "observe.tracing"
    return next((name for name in _ENDPOINTS if env.get(name)), None)


def tracing_wanted(enabled: bool, environ: Mapping[str, str] | None = None) -> bool:
    return tracing_source(enabled, environ) is not None


def build_tracer(enabled: bool) -> Tracer | None:
    """The tracer, or None when tracing is off or OpenTelemetry is not installed."""
    source = tracing_source(enabled)
    if source is None:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        log.warning("tracing is on but opentelemetry is not installed; tracing is off")
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _configure_provider(trace, source)
    return Tracer(trace.get_tracer("ballast"), Status, StatusCode, TraceContextTextMapPropagator())


def _configure_provider(trace: Any, source: str) -> None:
    """Set up this process's exporting provider once, unless one is already set; say once
    where the spans go."""
    global _configured
    if _configured is not None:
        return
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _configured = False  # someone else's provider: its exporters are theirs
        log.info("tracing on (%s): spans go to the tracer provider already set up", source)
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("the OpenTelemetry SDK is not installed; spans go nowhere")
        _configured = False
        return
    exporter = _exporter()
    _configured = True
    log.info("tracing on (%s): spans go to %s", source, _destination(exporter))
    if exporter is None:
        return
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "ballast"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _destination(exporter: Any) -> str:
    """Where the exporter sends spans, as the start-up line says it (credentials masked)."""
    if exporter is None:
        return "nowhere (OTEL_TRACES_EXPORTER=none or no OTLP exporter installed)"
    if type(exporter).__name__ == "ConsoleSpanExporter":
        return "the console"
    env = os.environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
        endpoint = base.rstrip("/") + "/v1/traces"
    return "OTLP/HTTP " + mask_url(endpoint)


def _exporter() -> Any:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported here; using otlp", kind[:40])
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol.strip().lower() == "grpc":
        log.warning("OTLP over gRPC is not included; exporting over OTLP/HTTP (protobuf)")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning("opentelemetry-exporter-otlp-proto-http is not installed; no export")
        return None
    return OTLPSpanExporter()


def request_attributes(path: str, request: Any) -> dict[str, Any]:
    """The GenAI attributes of a finished request, from its context (None: not a model
    request, or it ended before parsing)."""
    operation = {"/embeddings": "embeddings", "/completions": "text_completion"}.get(path, "chat")
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation}
    if request is None:
        return attributes
    attributes["gen_ai.request.model"] = request.model[:200]
    attributes["ballast.shape"] = getattr(request, "shape", "openai")
    if request.answered_model:
        attributes["gen_ai.response.model"] = request.answered_model[:200]
    if request.tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = request.tokens[0]
        attributes["gen_ai.usage.output_tokens"] = request.tokens[1]
    reason = getattr(request, "finish_reason", None)
    if isinstance(reason, str):
        attributes["gen_ai.response.finish_reasons"] = (reason[:40],)
    if request.attempts is not None:
        attributes["ballast.attempts"] = request.attempts.count
    return attributes


def attempt_attributes(target: Any, model: str) -> dict[str, Any]:
    """The GenAI attributes of one upstream attempt: who was asked, for what."""
    deployment = target.deployment
    return {
        "gen_ai.provider.name": str(deployment.provider),
        "gen_ai.request.model": target.adapter.upstream_model(model)[:200],
        "server.address": urlsplit(deployment.url).hostname,
    }

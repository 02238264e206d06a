"""A small OTLP/HTTP trace receiver for tests: accepts `POST /v1/traces` (protobuf), decodes
it with the official `opentelemetry-proto` messages and keeps every span it was sent."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    name: str
    span_id: bytes
    parent_span_id: bytes
    trace_id: bytes
    status_code: int
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                ok = self.path == "/v1/traces" and "protobuf" in self.headers.get(
                    "content-type", ""
                )
                if ok:
                    receiver._take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            span_id=span.span_id,
                            parent_span_id=span.parent_span_id,
                            trace_id=span.trace_id,
                            status_code=span.status.code,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            resource=resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

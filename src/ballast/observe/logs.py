"""Structured logs: one JSON line (or one text line) per request and per notable event.

Callers pass what a line says as `extra={"fields": {...}}`; nothing else about a request
is ever logged (no headers, no bodies, no keys). Formatting and writing happen on a
background thread behind a queue, so a request pays for building a log record and a
queue put, not for serialisation or a write to stderr."""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
import time
from typing import IO, Any

import orjson

ACCESS = logging.getLogger("ballast.access")
EVENTS = logging.getLogger("ballast.events")

# Field names that must never appear in a log line, whatever a caller passes.
_SECRET_KEYS = frozenset(
    {"authorization", "api_key", "api-key", "x-api-key", "master_key", "token", "password"}
)


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    if _SECRET_KEYS.isdisjoint(k.lower() for k in fields):
        return fields
    return {k: ("****" if k.lower() in _SECRET_KEYS else v) for k, v in fields.items()}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...fields}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(_clean(fields))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`, for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in _clean(fields).items())
        return line


def _iso(created: float) -> str:
    whole = time.gmtime(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", whole) + f".{int(created % 1 * 1000):03d}Z"


class _QueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: formatting happens on the listener's thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


_listener: logging.handlers.QueueListener | None = None
_installed: logging.Handler | None = None


def formatter_for(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {log_format!r} (json or text)")


def setup_logging(
    level: str = "info", log_format: str = "text", stream: IO[str] | None = None
) -> None:
    """Route every log record through a queue to one stderr writer. Idempotent."""
    global _listener, _installed
    formatter = formatter_for(log_format)
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    if _listener is not None:
        _listener.stop()
    writer = logging.StreamHandler(stream or sys.stderr)
    writer.setFormatter(formatter)
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = _QueueHandler(records)
    _listener = logging.handlers.QueueListener(records, writer, respect_handler_level=False)
    _listener.start()
    _installed = handler
    root.addHandler(handler)
    for name in ("uvicorn", "uvicorn.access"):
        # uvicorn's own lines go out in the same format, through the same queue.
        server_log = logging.getLogger(name)
        server_log.handlers.clear()
        server_log.propagate = True
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def _stop() -> None:
    if _listener is not None:
        _listener.stop()


atexit.register(_stop)


def access_logged() -> bool:
    """Whether request lines are written: callers build one only then."""
    return ACCESS.isEnabledFor(logging.INFO)


def log_request(fields: dict[str, Any]) -> None:
    # A record built directly: `Logger.info` would also walk the stack to find the caller.
    if ACCESS.isEnabledFor(logging.INFO):
        record = logging.LogRecord("ballast.access", logging.INFO, "", 0, "request", None, None)
        record.fields = fields
        ACCESS.handle(record)


def log_event(name: str, fields: dict[str, Any], level: int = logging.INFO) -> None:
    if EVENTS.isEnabledFor(level):
        EVENTS.log(level, name, extra={"fields": {"event": name, **fields}})

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
import re
import sys
import time
from collections.abc import Iterable
from typing import IO, Any

import orjson

from ballast.config import MASK, mask_url, scrub

ACCESS = logging.getLogger("ballast.access")
EVENTS = logging.getLogger("ballast.events")

# Field names that must never appear in a log line, whatever a caller passes.
_SECRET_KEYS = frozenset(
    {"authorization", "api_key", "api-key", "x-api-key", "master_key", "token", "password"}
)


_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
# Keys as OpenAI, Anthropic and Ballast itself (`sk-bl-`) shape them.
_KEY_SHAPED = re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")
# The configured secrets' values (`hide`): masked wherever they appear in a line.
_hidden: tuple[str, ...] = ()


def hide(secrets: Iterable[str]) -> None:
    """Mask these values (the config's secrets) in every line from now on, as well as those
    hidden before (a reload's old master key is still a secret)."""
    global _hidden
    every = {*_hidden, *secrets}
    _hidden = tuple(sorted(every, key=len, reverse=True))  # a longer one before its part


def redact(text: str) -> str:
    """A message or a field with what looks like a credential masked: `?token=` and other
    secret query parameters (uvicorn's access lines at debug carry the whole path),
    passwords in URLs, bearer tokens, key-shaped words and the config's own secrets. Runs
    on the log writer's thread, never on the request path."""
    if "=" in text or "://" in text:
        text = mask_url(text)
    if "earer " in text or "asic " in text:
        text = _BEARER.sub(r"\1 ****", text)
    if "sk-" in text:
        text = _KEY_SHAPED.sub("sk-****", text)
    return scrub(text, _hidden, MASK) if _hidden else text


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    """A line's fields with secrets masked: by their name, and in every text value (a client
    can put a key in any header Ballast logs, such as `x-request-id`)."""
    return {
        k: ("****" if k.lower() in _SECRET_KEYS else redact(v) if isinstance(v, str) else v)
        for k, v in fields.items()
    }


_PLAIN = re.compile(r"[^\s\"=\\\x00-\x1f\x7f]*")


def _text_value(value: Any) -> str:
    """One `key=value` value: quoted and escaped (JSON string rules) unless it is plain, so
    a newline or a quote in a client's model name cannot forge a field or a log line."""
    text = value if isinstance(value, str) else str(value)
    if _PLAIN.fullmatch(text):
        return text
    return orjson.dumps(text).decode()


def _escape_line(text: str) -> str:
    """Control characters of a message as escapes: one record is one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...fields}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(_clean(fields))
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`, for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = _escape_line(redact(record.getMessage()))
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(
                f"{_text_value(k)}={_text_value(v)}" for k, v in _clean(fields).items()
            )
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
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
    chosen = getattr(logging, level.upper(), logging.INFO)
    for name in ("ballast", "uvicorn"):  # Ballast's own lines and its server's
        logging.getLogger(name).setLevel(chosen)
    # Other libraries answer to the root, which never goes below info: at debug, aiosqlite
    # logs SQL parameters (every key's hash, job inputs) and others log as much.
    root.setLevel(max(chosen, logging.INFO))


def stop_logging() -> None:
    """Write what is queued and take the handler off (at exit, and in tests)."""
    global _listener, _installed
    if _installed is not None:
        logging.getLogger().removeHandler(_installed)
        _installed = None
    if _listener is not None:
        _listener.stop()
        _listener = None


atexit.register(stop_logging)


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

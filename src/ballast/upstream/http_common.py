"""The vocabulary every part of the HTTP/1.1 client shares: its errors, where a request
goes (`Origin`, `split_url`), the request header lines and the answer's header lookup.

Why a module of its own: the response, the connection protocol, the pool and the proxy
handshake (`proxy.py`) all speak these terms, and none of them should need the others to
do so. It holds no I/O.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from typing import NamedTuple, TypeVar
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # the most an answer's status line and headers may take


_E = TypeVar("_E", bound=BaseException)


def again(error: _E) -> _E:
    """A stored error to raise once more, as a copy: raised itself, it would keep the
    traceback of each raise, whose frames hold its owner (an answer, a decoder), which
    holds it: a reference cycle per failed answer, left for the collector."""
    return copy.copy(error)


class HttpError(Exception):
    """An exchange that ended before its answer was complete."""


class ConnectFailed(HttpError):
    """No connection could be opened (refused, unknown host, TLS handshake)."""


class ConnectTimeout(ConnectFailed):
    pass


class PoolTimeout(HttpError):
    """Every connection of the pool stayed busy for the whole wait."""


class Disconnected(HttpError):
    """The connection closed or broke before the answer ended."""


class BadResponse(HttpError):
    """The upstream's bytes are not an HTTP/1.1 answer we can read."""


class TooLarge(BadResponse):
    """An answer (or one of its events) larger than a configured limit; its message names
    the limit."""


class Origin(NamedTuple):
    tls: bool
    host: str
    port: int
    host_header: bytes  # the request's `host` line, ready to write


@lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, bytes]:
    """Where a URL is served and the request target to ask there. ValueError if it is not an
    http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    tls = parts.scheme == "https"
    default = 443 if tls else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    if port != default:
        shown = f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n") or any(c in shown for c in "\r\n"):
        raise ValueError("URL has whitespace in it")
    origin = Origin(tls, host, port, b"host: " + shown.encode("idna") + b"\r\n")
    return origin, target.encode("ascii")


# What a header value must not hold: C0 controls but tab (CR, LF and NUL among them), and DEL.
_BAD_VALUE = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


_CHECKED_NAMES: set[str] = set()


def header_line(name: str, value: str) -> bytes:
    """One request header line, ending in CRLF. ValueError for a name or value that would
    break the framing (header injection), hold a control character, or not be Latin-1 (sent
    as is, never silently turned into something else). Configured headers are checked
    more strictly when the config loads; this guards values that arrive with a request."""
    if name not in _CHECKED_NAMES:
        if not name or any(c in name for c in " \t\r\n:"):
            raise ValueError(f"invalid header {name!r}")
        if len(_CHECKED_NAMES) < 256:
            _CHECKED_NAMES.add(name)  # a request writes the same few names every time
    if not value.isprintable() and _BAD_VALUE.search(value):  # the usual value is printable
        raise ValueError(f"invalid header {name!r}")
    try:
        return f"{name}: {value}\r\n".encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"invalid header {name!r}: not Latin-1") from None


def header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(header_line(name, value) for name, value in headers.items())


class Headers:
    """Case-insensitive lookup over an answer's raw headers; the first value wins."""

    __slots__ = ("_map",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        found: dict[str, str] = {}
        for name, value in raw:
            found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        self._map = found

    def get(self, name: str) -> str | None:
        return self._map.get(name.lower())

"""Checks of configured values that go out on the wire (header names and values, URLs) or
are read at start-up (files): refused at load, with the setting named, rather than failing
requests much later."""

from __future__ import annotations

import ipaddress
import re

HTTP_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Controls a header value must not hold: C0 (tab aside) and DEL; CR, LF and NUL among them.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A host name, or an IPv6 literal in brackets (checked again below), then an optional port.
_URL = re.compile(r"^https?://(?:[^/\s:\[\]]+|\[([0-9A-Fa-f:.]+)\])(?::\d+)?(?:/\S*)?$")


def header_problem(name: str, value: str) -> str | None:
    """What makes a configured header unusable, said of the header, if anything: a name that
    is not an HTTP token, or a value `value_problem` refuses."""
    if not HTTP_TOKEN.match(name):
        return f"header name {name!r} is not an HTTP token"
    problem = value_problem(value)
    return None if problem is None else f"header {name!r} has {problem} in its value"


def value_problem(text: str) -> str | None:
    """What makes a configured header value unusable, if anything.

    Configured values must be printable ASCII (space and tab allowed): the YAML is read as
    UTF-8 but a header goes out as Latin-1 bytes, so anything past ASCII would reach the
    upstream as different bytes than the operator typed (a pasted curly quote or a
    non-breaking space in a key turns into a 401 much later). Refused here, it is a clear
    start-up error instead."""
    if _CONTROL.search(text):
        return "a control character"
    if not text.isascii():
        return "a non-ASCII character"
    return None


def http_url(value: str) -> str:
    """An upstream's base URL, without its trailing slash; ValueError when it is not one."""
    match = _URL.match(value)
    if not match:
        raise ValueError(f"not a URL: {_url_problem(value)}")
    if match.group(1) is not None:
        try:
            ipaddress.IPv6Address(match.group(1))
        except ValueError:
            raise ValueError("not a URL (bad IPv6 literal)") from None
    return value.rstrip("/")


def _url_problem(value: str) -> str:
    """Why a value is not an http(s) URL, said without repeating it (it may hold a secret)."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return "it has no scheme; add http:// or https:// at its start"
    if scheme.lower() not in ("http", "https"):
        return "its scheme must be http:// or https://"
    if scheme not in ("http", "https"):
        return "write its scheme in lower case (http:// or https://)"
    if any(ch.isspace() for ch in value):
        return "it contains a space or another blank"
    if not rest or rest[0] in "/:?#":
        return "it has no host after the scheme"
    return "expected http(s)://host[:port][/path]"


def readable(path: str) -> str | None:
    """Why a file cannot be read, or None when it can (read now, so a typo stops start-up)."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None

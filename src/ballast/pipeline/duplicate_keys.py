"""Refusing a body that gives a field Ballast reads more than once.

JSON leaves duplicate names undefined: orjson keeps the last pair, an upstream's parser may
keep the first. A body with `"model"` or `"max_tokens"` twice would then be checked and
reserved as one request and answered as another, so such a body is refused (400, naming the
field). Only the top-level fields a shape reads count; anything else may repeat.

This runs on every request, so it is a byte-level pre-test: only the read fields the parsed
body has can be given twice, and each of those is counted in the bytes (a C-speed search,
no regular expression over the body); the body is parsed again (with the standard library,
which shows every pair) only when one appears twice, or when the body escapes an ASCII
letter (`"mod\\u0065l"` is `"model"` too), which no usual encoder does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import orjson

from ballast.pipeline.errors import bad_request

# `\u0050`-`\u007f`: an escaped letter or underscore, as a field name could be written.
_ESCAPED_LETTER = re.compile(rb"\\u00[5-7]")


class DuplicateKeys:
    """The check for one shape's read fields."""

    __slots__ = ("_names", "_quoted")

    def __init__(self, names: Iterable[str]) -> None:
        self._names = frozenset(names)
        self._quoted = {name: b'"' + name.encode() + b'"' for name in self._names}

    def load(self, body: bytes) -> dict[str, Any]:
        """The request body as the JSON object it must be, its read fields given once: the
        one reading of a client's body every shape starts with (a clear 400 otherwise)."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise bad_request("We could not parse the JSON body of your request.") from None
        if not isinstance(payload, dict):
            raise bad_request("The request body must be a JSON object.")
        self.check(body, payload)
        return payload

    def check(self, body: bytes, payload: dict[str, Any]) -> None:
        """Raise a 400 when a read field appears twice in `body`'s top-level object;
        `payload` is that body as orjson parsed it (a field given twice is in it once)."""
        quoted = self._quoted
        for name in payload:
            needle = quoted.get(name)
            if needle is not None and body.count(needle) > 1:
                self._look_closer(body)
                return
        if b"\\u00" in body and _ESCAPED_LETTER.search(body) is not None:
            self._look_closer(body)

    def _look_closer(self, body: bytes) -> None:
        """Every top-level pair, as written; the first read field named twice is refused."""
        try:
            pairs = json.loads(body, object_pairs_hook=list)
        except RecursionError:
            raise bad_request("The JSON body of your request is nested too deeply.") from None
        seen: set[str] = set()
        for name, _ in pairs:
            if name in self._names:
                if name in seen:
                    raise bad_request(f"The field '{name}' is given more than once.", name)
                seen.add(name)

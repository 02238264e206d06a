"""Refusing a body that gives a field Ballast reads more than once.

JSON leaves duplicate names undefined: orjson keeps the last pair, an upstream's parser may
keep the first. A body with `"model"` or `"max_tokens"` twice would then be checked and
reserved as one request and answered as another, so such a body is refused (400, naming the
field). Only the top-level fields a shape reads count; anything else may repeat.

This runs on every request, so it is a byte-level pre-test: one regular-expression pass
finds the quoted names of the read fields, and the body is parsed again (with the standard
library, which shows every pair) only when one of them appears twice, or when the body
escapes an ASCII letter (`"mod\\u0065l"` is `"model"` too), which no usual encoder does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from ballast.pipeline.errors import bad_request

# `\u0050`-`\u007f`: an escaped letter or underscore, as a field name could be written.
_ESCAPED_LETTER = re.compile(rb"\\u00[5-7]")


class DuplicateKeys:
    """The check for one shape's read fields."""

    __slots__ = ("_names", "_quoted")

    def __init__(self, names: Iterable[str]) -> None:
        self._names = frozenset(names)
        alternatives = b"|".join(re.escape(name.encode()) for name in sorted(self._names))
        self._quoted = re.compile(rb'"(?:' + alternatives + rb')"')

    def check(self, body: bytes) -> None:
        """Raise a 400 when a read field appears twice in `body`'s top-level object (a
        body orjson has already parsed into an object)."""
        found = self._quoted.findall(body)
        if len(found) > 1 and len(set(found)) < len(found):
            self._look_closer(body)
        elif b"\\" in body and _ESCAPED_LETTER.search(body) is not None:
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

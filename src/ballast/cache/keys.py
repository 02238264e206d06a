"""The cache key: a hash of everything in a request that can change its answer.

Left out: how the answer is delivered (`stream`, `stream_options`), who asks (`user`,
`metadata`, `store`) and Ballast's own controls (`cache`, `fallbacks`). Top-level nulls are the
same as absent, numeric sampling parameters compare as numbers (`1` is `1.0`), and key order
never matters. The scope (a key id, or nothing for a global cache) is hashed in with the rest,
so neither an API key nor its id ever appears in a cache key."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

EXCLUDED = frozenset(
    {"stream", "stream_options", "user", "metadata", "store", "cache", "fallbacks"}
)
_NUMERIC = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})
VERSION = b"v1"


def normalise(payload: dict[str, Any]) -> dict[str, Any]:
    """The request as far as its answer is concerned."""
    out: dict[str, Any] = {}
    for name, value in payload.items():
        if name in EXCLUDED or value is None:
            continue
        if name in _NUMERIC and type(value) is int:
            value = float(value)
        out[name] = value
    return out


def cache_key(path: str, group: str, payload: dict[str, Any], scope: str) -> str:
    """A fixed-length hex digest for one request under one scope ("" for a global cache)."""
    canonical = orjson.dumps(normalise(payload), option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256()
    for part in (VERSION, scope.encode(), path.encode(), group.encode()):
        digest.update(part)
        digest.update(b"\0")
    digest.update(canonical)
    return digest.hexdigest()

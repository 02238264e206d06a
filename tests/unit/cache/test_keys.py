"""The cache key: what changes the answer changes the key, what only delivers it does not, and
nothing in it is in clear."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.cache.keys import cache_key, normalise

CHAT = "/chat/completions"
BASE: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 20,
}


def key(payload: dict[str, Any], scope: str = "k1", path: str = CHAT, group: str = "chat") -> str:
    return cache_key(path, group, payload, scope)


def test_delivery_and_identity_fields_do_not_change_the_key() -> None:
    same = {
        **BASE,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "someone",
        "metadata": {"trace": "x"},
        "cache": {"no-store": True},
        "store": False,
        "seed": None,  # null is the same as absent
    }
    assert key(same) == key(BASE)
    reordered = dict(reversed(list(BASE.items())))
    reordered["messages"] = [{"content": "hi", "role": "user"}]
    assert key(reordered) == key(BASE)
    assert key({**BASE, "temperature": 0.0}) == key(BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"temperature": 0.5},
        {"max_tokens": 21},
        {"model": "chat-2"},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
        {"n": 2},
        {"seed": 7},
    ],
)
def test_everything_that_changes_the_answer_changes_the_key(change: dict[str, Any]) -> None:
    assert key({**BASE, **change}) != key(BASE)


def test_scope_path_and_group_are_part_of_the_key_and_nothing_is_in_clear() -> None:
    assert key(BASE, scope="k1") != key(BASE, scope="k2")
    assert key(BASE, path="/completions") != key(BASE)
    assert key(BASE, group="other") != key(BASE)
    digest = key(BASE, scope="key-id-123")
    assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    assert "key-id-123" not in digest
    assert "stream" not in normalise({**BASE, "stream": True})

"""Splicing a continuation onto what the client already has."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.pipeline.relay import _Diverged, _Splice


def chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    payload = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def content(event: bytes | None) -> str | None:
    if event is None:
        return None
    payload = orjson.loads(event[len(b"data: ") :])
    return payload["choices"][0]["delta"].get("content")  # type: ignore[no-any-return]


def test_regeneration_drops_what_the_client_has_and_relays_the_rest() -> None:
    splice = _Splice("tok0 tok1 ", regenerate=True)
    assert splice.apply(chunk("", role=True)) is None
    assert splice.apply(chunk("tok0 ")) is None
    assert content(splice.apply(chunk("tok1 tok2 "))) == "tok2 "
    assert content(splice.apply(chunk("tok3 "))) == "tok3 "
    assert splice.apply(chunk(finish="stop")) is not None
    assert splice.apply(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


def test_prefill_continuation_only_loses_its_role() -> None:
    splice = _Splice("tok0 tok1 ", regenerate=False)
    assert splice.apply(chunk("", role=True)) is None
    assert content(splice.apply(chunk("tok2 "))) == "tok2 "


def test_a_different_regenerated_answer_diverges() -> None:
    splice = _Splice("tok0 tok1 ", regenerate=True)
    with pytest.raises(_Diverged):
        splice.apply(chunk("other "))


@pytest.mark.parametrize("end", [chunk(finish="stop"), b"data: [DONE]\n\n"])
def test_a_regenerated_answer_that_ends_early_diverges(end: bytes) -> None:
    splice = _Splice("tok0 tok1 tok2 ", regenerate=True)
    assert splice.apply(chunk("tok0 ")) is None
    with pytest.raises(_Diverged):
        splice.apply(end)

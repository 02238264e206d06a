"""A whole answer put back together from a stream that carries signed thinking: each block's
text is the reasoning since the block before it, its signature the one its delta brought, in
order with the redacted blocks between them."""

from __future__ import annotations

from typing import Any

import orjson

from ballast.stream.assemble import assemble_payload
from ballast.stream.event import events_of


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "c", "model": "m", "choices": [choice]}) + b"\n\n"


def signed(signature: str, text: str = "") -> dict[str, Any]:
    block = {"type": "thinking", "thinking": text, "signature": signature}
    return {"thinking_blocks": [block]}


def test_signed_thinking_blocks_are_put_back_together_in_order() -> None:
    redacted = {"type": "redacted_thinking", "data": "ZW5j"}
    stream = b"".join(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning_content": "one "}),
            chunk({"reasoning_content": "two"}),
            chunk(signed("s1")),
            chunk({"thinking_blocks": [redacted]}),
            chunk({"reasoning_content": "three"}),
            chunk(signed("s2", " more")),  # text not yet sent as reasoning comes with it
            chunk({"content": "done"}, "stop"),
            b"data: [DONE]\n\n",
        ]
    )
    answer = assemble_payload("/chat/completions", events_of(stream))
    assert answer is not None
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == "one twothree" and message["content"] == "done"
    assert message["thinking_blocks"] == [
        {"type": "thinking", "thinking": "one two", "signature": "s1"},
        redacted,
        {"type": "thinking", "thinking": "three more", "signature": "s2"},
    ]


def test_a_thinking_block_it_cannot_read_is_not_put_back_together() -> None:
    stream = chunk({"thinking_blocks": [{"type": "thinking"}]}, "stop") + b"data: [DONE]\n\n"
    assert assemble_payload("/chat/completions", events_of(stream)) is None
    plain = chunk({"content": "hi"}, "stop") + b"data: [DONE]\n\n"
    answer = assemble_payload("/chat/completions", events_of(plain))
    assert answer is not None and "thinking_blocks" not in answer["choices"][0]["message"]

"""Through the real server, a plain stream's chunks go on to the client from the upstream
connection's callback (the relay's task does not wake per token), and the client sees the
same stream as before: every token, usage only when asked for, the stream's end; in another
API's shape too, its translator reshaping each piece on the way. A stream the response cache
keeps goes through `send`, piece by piece, to be recorded."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from ballast.stream.exchange import UpstreamStream
from tests.e2e.test_routing import MESSAGES, client, config, full, ordered
from tests.stack import Stack, deployment, group

TOKENS = 40


@pytest.fixture
def pumped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the chunks handed on from the connection's callback."""
    seen = [0]
    original = UpstreamStream._on_chunk

    def counting(self: UpstreamStream, chunk: bytes) -> None:
        seen[0] += 1
        original(self, chunk)

    monkeypatch.setattr(UpstreamStream, "_on_chunk", counting)
    yield seen


def test_a_plain_stream_is_relayed_from_the_connection_callback(
    stack: Stack, pumped: list[int]
) -> None:
    sim = stack.sim(f"ok?tokens={TOKENS}&delay=0.005")
    gateway = stack.gateway(config(ordered("chat", deployment("a", sim, "m"))))
    api = client(gateway)
    text, usage, finish = "", [], None
    for chunk in api.chat.completions.create(model="chat", messages=MESSAGES, stream=True):
        usage.append(chunk.usage)
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (text, finish) == (full(TOKENS), "stop")
    assert usage == [None] * len(usage)  # Ballast asked for it; the client did not
    assert pumped[0] >= TOKENS // 2  # most tokens, each in a read of its own

    asked = api.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    last = list(asked)[-1]
    assert last.usage is not None and last.usage.completion_tokens == TOKENS


def test_a_stream_in_the_messages_shape_is_pumped_through_its_translator(
    stack: Stack, pumped: list[int]
) -> None:
    sim = stack.sim(f"ok?tokens={TOKENS}&delay=0.005")
    gateway = stack.gateway(config(ordered("chat", deployment("a", sim, "m"))))
    api = anthropic.Anthropic(base_url=gateway.url, api_key="sk-client", max_retries=0)
    with api.messages.stream(model="chat", max_tokens=100, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full(TOKENS)
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == TOKENS
    assert pumped[0] >= TOKENS // 2


def test_a_stream_the_cache_keeps_goes_through_send(stack: Stack, pumped: list[int]) -> None:
    sim = stack.sim(f"ok?tokens={TOKENS}&delay=0.005")
    cached = group("chat", deployment("a", sim, "m"), cache={"ttl": 60})
    gateway = stack.gateway(config(cached))
    api = client(gateway)
    for _ in range(2):  # kept, then served from the cache
        chunks = list(api.chat.completions.create(model="chat", messages=MESSAGES, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == full(TOKENS)
    assert pumped[0] == 0

"""Each event of a relayed stream is parsed once, however many parts of the gateway read it
(the stream's state and clocks, the usage filter, the cache's recorder, a shape's
translator), on every shape a stream can be asked in: chat (plain, and kept by the cache),
Messages bridged to chat and served natively, Responses bridged to chat and served natively.

Every JSON parse in the process is watched while the stream runs; the parses of the
upstream's events are counted, each event's data by its bytes (the simulator's events all
differ: each carries its own token, or its own sequence number). A native Messages stream's
text deltas say all the gateway reads of them in their bytes, and are not parsed at all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from tests.e2e.test_routing import MESSAGES, client, config, full, ordered
from tests.stack import Gateway, Stack, deployment, group

TOKENS = 24
# The starts of the upstream's typed events: Responses', and Messages' token deltas.
_TYPED = (b'{"type":"response.', b'{"type":"content_block_delta"')


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[bytes]]:
    """The upstream events' data parsed while the test runs, with how often each was."""
    seen: Counter[bytes] = Counter()
    loads = orjson.loads

    def counting(data: Any) -> Any:
        if isinstance(data, bytes | bytearray | memoryview):
            text = bytes(data).strip()
            if b'"chat.completion.chunk"' in text or text.startswith(_TYPED):
                seen[text] += 1
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    yield seen


def _chat(gateway: Gateway) -> str:
    chunks = client(gateway).chat.completions.create(model="chat", messages=MESSAGES, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _messages(model: str) -> Callable[[Gateway], str]:
    def run(gateway: Gateway) -> str:
        api = anthropic.Anthropic(base_url=gateway.url, api_key="sk-client", max_retries=0)
        with api.messages.stream(model=model, max_tokens=100, messages=MESSAGES) as stream:
            return "".join(stream.text_stream)

    return run


def _responses(model: str) -> Callable[[Gateway], str]:
    def run(gateway: Gateway) -> str:
        api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)
        with api.responses.stream(model=model, input="hi") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        return "".join(deltas)

    return run


SHAPES: dict[str, Callable[[Gateway], str]] = {
    "chat": _chat,
    "chat-kept-by-the-cache": _chat,
    "messages": _messages("chat"),
    "messages-native": _messages("claude"),
    "responses-bridged": _responses("chat"),
    "responses-native": _responses("native"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_relayed_event_is_parsed_once(
    stack: Stack, parses: Counter[bytes], shape: str
) -> None:
    sim = stack.sim(f"ok?tokens={TOKENS}")
    extra: dict[str, Any] = {"cache": {"ttl": 60}} if shape == "chat-kept-by-the-cache" else {}
    models = [
        ordered("chat", deployment("a", sim, "m"), **extra),
        group("native", deployment("n", sim, model="sim-native", responses="native")),
        group(
            "claude",
            {**deployment("c", sim, model="sim-claude", provider="anthropic"), "url": sim.url},
        ),
    ]
    gateway = stack.gateway(config(*models))
    parses.clear()  # what starting the gateway parsed is not the stream's
    assert SHAPES[shape](gateway) == full(TOKENS)
    if shape == "messages-native":  # its text deltas are read off their bytes, not parsed
        assert parses == Counter()
    else:
        assert len(parses) >= TOKENS, "every token's event was read"
    twice = {data: n for data, n in parses.items() if n > 1}
    assert twice == {}, f"{len(twice)} of {len(parses)} events parsed more than once"

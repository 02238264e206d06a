"""The Gemini and Bedrock stream decoders in any chunking: the chat events are the same
however the bytes are split, and an in-band error comes after every event before it (those
are the client's), as the Decoder contract says."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.providers.bedrock import BedrockDecoder
from ballast.providers.gemini import GeminiDecoder
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from tests.unit.upstream.test_eventstream import frame

IDS = ("chatcmpl-1", 0, "m")
FAST = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


def _gemini_stream(pieces: list[str], error: bool = False) -> bytes:
    chunks: list[Any] = [{"candidates": [{"content": {"parts": [{"text": p}]}}]} for p in pieces]
    if error:
        chunks.append({"error": {"code": 503, "status": "UNAVAILABLE", "message": "busy"}})
    else:
        chunks.append({"candidates": [{"content": {"parts": [{"text": ""}]},
                                       "finishReason": "STOP"}],
                       "usageMetadata": {"promptTokenCount": 1,
                                         "candidatesTokenCount": len(pieces)}})  # fmt: skip
    return b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)


def _bedrock_stream(pieces: list[str], error: bool = False) -> bytes:
    def ev(name: str, payload: dict[str, object]) -> bytes:
        headers = {":event-type": name, ":message-type": "event"}
        return frame(dict(headers), orjson.dumps(payload))

    frames = [ev("messageStart", {"role": "assistant"})]
    frames += [ev("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}})
               for p in pieces]  # fmt: skip
    if error:
        headers = {":message-type": "exception", ":exception-type": "throttlingException"}
        frames.append(frame(dict(headers), b'{"message":"slow down"}'))
    else:
        frames.append(ev("messageStop", {"stopReason": "end_turn"}))
        frames.append(ev("metadata", {"usage": {"inputTokens": 1, "outputTokens": len(pieces)}}))
    return b"".join(frames)


def _run(decoder: GeminiDecoder | BedrockDecoder, data: bytes, cuts: list[int]) -> list[bytes]:
    events: list[bytes] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        events += decoder.feed(data[start:cut])
        start = cut
    return events + decoder.finish()


def _text(events: list[bytes]) -> str:
    text = ""
    for event in events:
        if event == b"data: [DONE]":
            continue
        payload = orjson.loads(event[len(b"data: ") :])
        for choice in payload["choices"]:
            text += choice["delta"].get("content") or ""
    return text


pieces = st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6)


@FAST
@given(pieces, st.lists(st.integers(0, 2000), max_size=8), st.sampled_from(["gemini", "bedrock"]))
def test_any_chunking_gives_the_same_answer(texts: list[str], cuts: list[int], wire: str) -> None:
    data = _gemini_stream(texts) if wire == "gemini" else _bedrock_stream(texts)
    decoder = GeminiDecoder(IDS, True) if wire == "gemini" else BedrockDecoder(IDS, True)
    events = _run(decoder, data, [c % (len(data) + 1) for c in cuts])
    assert _text(events) == "".join(texts)
    assert events[-1] == b"data: [DONE]"
    assert orjson.loads(events[-2][6:])["usage"]["completion_tokens"] == len(texts)


@pytest.mark.parametrize("wire", ["gemini", "bedrock"])
def test_an_in_band_error_comes_after_the_text_before_it(wire: str) -> None:
    data = (
        _gemini_stream(["a", "b"], True) if wire == "gemini" else _bedrock_stream(["a", "b"], True)
    )
    decoder = GeminiDecoder(IDS, False) if wire == "gemini" else BedrockDecoder(IDS, False)
    events = decoder.feed(data)  # everything in one read
    assert _text(events) == "ab"
    with pytest.raises(Failure) as caught:
        decoder.finish()
    expected = failures.SERVER_ERROR if wire == "gemini" else failures.RATE_LIMITED
    assert caught.value.kind is expected


def test_a_bad_crc_after_good_frames_is_a_bad_response_after_them() -> None:
    data = bytearray(_bedrock_stream(["a", "b"]))
    data[-1] ^= 0xFF  # the last frame's CRC
    decoder = BedrockDecoder(IDS, False)
    events = decoder.feed(bytes(data))
    assert _text(events) == "ab"
    with pytest.raises(Failure) as caught:
        decoder.finish()
    assert caught.value.kind is failures.BAD_RESPONSE


def test_a_stream_ending_inside_a_frame_owes_nothing() -> None:
    data = _bedrock_stream(["a"])
    decoder = BedrockDecoder(IDS, False)
    events = decoder.feed(data[:-5])
    assert decoder.finish() == []  # the transport reports the cut
    assert _text(events) == "a"

"""A long-stream upstream for the bench: every chat completion is an SSE stream of TOKENS
content chunks, SPACING seconds apart, each carrying the time it was written
(CLOCK_MONOTONIC in ns, which every process on the machine shares) as its content, so a
client can tell how long each token took to reach it through a gateway.

One timer serves every stream: each tick writes the next chunk of every stream due, so the
upstream's own cost stays small next to the gateways it feeds. Raw asyncio on uvloop,
accepting connections in batches as Ballast does; HTTP/1.1 keep-alive with chunked answers;
`GET /health` answers `ok`.

Whole answers come at once, or `--answer-delay` seconds after their request (an upstream that
takes as long as a short generation, for the sustained-load bench); with that delay a stream
is short too: its role, one token and its end, all written once the delay is over (a gateway
that asks for a stream to assemble a whole answer waits as long as one that does not).

``python bench/tick_upstream.py PORT [--tokens 200] [--spacing 0.02] [--answer-delay 0.02]``
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
import uvloop

from ballast.server.accept import BatchAcceptServer
from ballast.server.serving import listener

# A burst of N streams connects at once; accepted at libuv's pace (one a loop turn) they
# overflow the listen queue and wait out SYN retries, which every target would pay.
ACCEPT_BATCH = 256

_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_HEALTH = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
_MODELS = b'{"object":"list","data":[{"id":"bench-stream","object":"model"}]}'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-tick",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "bench-stream",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return _chunk(b"data: " + orjson.dumps(body) + b"\n\n")


_ROLE = _event({"role": "assistant", "content": ""})
_TOKEN = _event({"content": "@@@@@@@@@@@@@@@@@@@ "})  # the stamp's place: 19 digits
_USAGE = _chunk(
    b'data: {"id":"chatcmpl-tick","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-stream","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":'
    b'200,"total_tokens":209}}\n\n'
)
_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-tick",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "bench-stream",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
)
_WHOLE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_ANSWER),
    _ANSWER,
)
_END = _event({}, "stop") + _USAGE + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
_SHORT_STREAM = _HEAD + _ROLE + _TOKEN.replace(b"@" * 19, b"0" * 19) + _END


class Ticker:
    """The one timer: every SPACING seconds, the next chunk of every live stream."""

    def __init__(self, tokens: int, spacing: float) -> None:
        self.tokens = tokens
        self.spacing = spacing
        self.streams: dict[Stream, int] = {}  # stream -> tokens sent

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.spacing
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            stamp = b"%019d" % time.monotonic_ns()
            token = _TOKEN.replace(b"@" * 19, stamp)
            done = []
            for stream, sent in self.streams.items():
                if stream.closed:
                    done.append(stream)
                    continue
                if sent >= self.tokens:
                    stream.write(_END)
                    stream.finish()
                    done.append(stream)
                    continue
                stream.write(token)
                self.streams[stream] = sent + 1
            for stream in done:
                del self.streams[stream]


class Stream(asyncio.Protocol):
    ticker: Ticker
    answer_delay = 0.0

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.closed = False
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def finish(self) -> None:
        self.busy = False
        self._next()

    def _answer(self, answer: bytes) -> None:
        self.write(answer)
        self.finish()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        """Answer the next whole request buffered, unless a stream is still running."""
        while not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith(b"get /health"):
                self.write(_HEALTH)
            elif head.startswith(b"get"):
                self.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
                self.write(b"content-length: %d\r\n\r\n%s" % (len(_MODELS), _MODELS))
            elif self.answer_delay > 0:  # the next request waits for this answer
                self.busy = True
                streamed = b'"stream":true' in body.replace(b" ", b"")
                answer = _SHORT_STREAM if streamed else _WHOLE
                asyncio.get_running_loop().call_later(self.answer_delay, self._answer, answer)
            elif b'"stream":true' not in body.replace(b" ", b""):
                self.write(_WHOLE)  # a whole answer (gateways' smoke tests ask for one)
            else:
                self.busy = True
                self.write(_HEAD + _ROLE)
                self.ticker.streams[self] = 0


async def serve(port: int, tokens: int, spacing: float, answer_delay: float = 0.0) -> None:
    ticker = Ticker(tokens, spacing)
    Stream.ticker = ticker
    Stream.answer_delay = answer_delay
    loop = asyncio.get_running_loop()
    sock = listener("127.0.0.1", port, backlog=8192)
    server = BatchAcceptServer(loop, sock, Stream, None, ACCEPT_BATCH)
    async with server:
        await ticker.run()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--spacing", type=float, default=0.02)
    parser.add_argument("--answer-delay", type=float, default=0.0)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.tokens, args.spacing, args.answer_delay))


if __name__ == "__main__":
    main()

"""What reading and translating one stream costs, without a server or an upstream: the
bench's fixed chat stream (and its Messages twin) typed event by event as the exchange types
them, then fed to each shape's translator, timed in process. It isolates the part of a
stream's cost that `bench/cpu.py` cannot split off: chat's relay reads its events and sends
them as they are, a bridged shape translates each, a native Messages stream reads its own.

    .venv/bin/python bench/translate.py
    .venv/bin/python bench/translate.py --src ../old/src   # an older tree, for an A/B

Not part of the test suite. Figures move with the machine's load: compare trees in one run.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nginx

REPO = Path(__file__).resolve().parent.parent
RESPONSES_REQUEST = {"model": "bench-stream", "stream": True, "input": "hi"}


def _per_call(fn: Callable[[], object], number: int) -> float:
    """Microseconds per call, the least disturbed of five repeats."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def cases() -> dict[str, tuple[Callable[[], object], int]]:
    """Per case: a function that reads (and translates) one whole stream, and its events."""
    from ballast.api.messages.stream import MessagesStream, NativeStream
    from ballast.api.responses.stream import ResponseStream
    from ballast.stream.exchange import UpstreamStream
    from ballast.stream.state import StreamState
    from ballast.upstream.sse import SseSplitter

    chat = SseSplitter(1 << 20).feed(nginx.stream_body().encode())
    messages = SseSplitter(1 << 20).feed(nginx.messages_stream_body().encode())
    reader: Any = UpstreamStream.__new__(UpstreamStream)  # only its event reading is used
    reader.upstream = None

    def typed(raw: list[bytes]) -> list[Any]:
        reader.state = StreamState()
        return [e for e in (reader._take(r) for r in raw) if e is not None]

    def translated(make: Callable[[], Any], raw: list[bytes]) -> Callable[[], object]:
        def run() -> bytes:
            translator = make()
            return bytes(translator.feed(typed(raw)) + translator.finish())

        return run

    return {
        "chat, read (relayed as it came)": (lambda: typed(chat), len(chat)),
        "native Messages, read": (translated(NativeStream, messages), len(messages)),
        "Messages bridged, read + translated": (
            translated(lambda: MessagesStream("bench-stream", None, 9), chat),
            len(chat),
        ),
        "Responses bridged, read + translated": (
            translated(lambda: ResponseStream(RESPONSES_REQUEST, "resp_bench", 0, ""), chat),
            len(chat),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=REPO / "src", help="Ballast's src/")
    parser.add_argument("--number", type=int, default=20_000, help="streams per repeat")
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    print(f"src {args.src}; microseconds per stream (and per event), least of 5 repeats")
    for name, (run, events) in cases().items():
        micros = _per_call(run, args.number)
        print(f"{name:<40} {micros:7.2f} us  ({micros / events:.2f} per event, {events} events)")


if __name__ == "__main__":
    main()

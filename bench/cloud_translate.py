"""Per-request cost of the cloud adapters' work, in process (no network): a chat request
turned into the provider's body and Wire, and its whole answer turned back, for Gemini, and
for Bedrock with and without its SigV4 signature (botocore's SigV4Auth over the final
bytes), against the same work the OpenAI pass-through does (the body forwarded as it is).

    .venv/bin/python bench/cloud_translate.py
    .venv/bin/python bench/cloud_translate.py --number 20000

Not part of the test suite; the best of three repetitions is reported."""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Callable
from typing import Any

import orjson
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.providers.base import Adapter, AdapterContext
from ballast.providers.bedrock import BedrockAdapter
from ballast.providers.gemini import GeminiAdapter
from ballast.providers.openai import OpenAIAdapter
from ballast.upstream.client import Upstream

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there, how are you today?"},
]
TEXT = "tok " * 16
GEMINI_ANSWER = orjson.dumps(
    {
        "candidates": [{"content": {"role": "model", "parts": [{"text": TEXT}]},
                        "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 16},
    }
)  # fmt: skip
BEDROCK_ANSWER = orjson.dumps(
    {
        "output": {"message": {"role": "assistant", "content": [{"text": TEXT}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 8, "outputTokens": 16, "totalTokens": 24},
    }
)


class Call:
    def __init__(self) -> None:
        self.path = "/chat/completions"
        self.payload: dict[str, Any] = {"model": "m", "messages": MESSAGES, "max_tokens": 64}
        self.raw = orjson.dumps(self.payload)
        self.model = "m"
        self.edits: dict[str, Any] = {}
        self.credential = "c"


def _adapter(cls: type[Adapter], **settings: Any) -> Any:
    deployment = Deployment(id="d", model="m", url="http://127.0.0.1:9", **settings)
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    return cls(deployment, upstream, AdapterContext())


def cases() -> dict[str, Callable[[], object]]:
    call = Call()
    passthrough = _adapter(OpenAIAdapter)
    gemini = _adapter(GeminiAdapter, provider="gemini", api_key="k")
    bedrock = _adapter(BedrockAdapter, provider="bedrock", aws={"region": "us-east-1"})
    bedrock._credentials = Credentials("AKIDBENCH", "secret", "token")
    bedrock._frozen = bedrock._credentials.get_frozen_credentials()
    bedrock._signer, bedrock._request = SigV4Auth, AWSRequest

    def openai() -> object:
        return orjson.loads(passthrough.body(call, "m"))

    def gemini_call() -> object:
        body = gemini.body(call, "m")
        return gemini.wire(call, "m", body, False).answer(GEMINI_ANSWER)

    def bedrock_call() -> object:
        body = bedrock.body(call, "m")
        return bedrock.wire(call, "m", body, False).answer(BEDROCK_ANSWER)

    def bedrock_unsigned() -> object:
        return bedrock.body(call, "m")

    return {
        "openai pass-through (body, parsed answer)": openai,
        "gemini (body, wire, answer)": gemini_call,
        "bedrock (body, SigV4 wire, answer)": bedrock_call,
        "bedrock body only (no signature, no answer)": bedrock_unsigned,
    }


async def main(number: int) -> None:
    for name, case in cases().items():
        best = min(timeit.repeat(case, number=number, repeat=3)) / number
        print(f"{name:44s} {best * 1e6:8.1f} us per request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=5000)
    asyncio.run(main(parser.parse_args().number))

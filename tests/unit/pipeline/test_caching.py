"""The response cache's HTTP side: the header and body field choose the mode, the field is
never forwarded, and the client's bytes are spliced rather than encoded again."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.cache.service import DEFAULT, NO_STORE, OFF, REFRESH
from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.pipeline.caching import mode_of, scope_of, take_field
from ballast.pipeline.context import RequestContext
from ballast.pipeline.errors import ApiError
from ballast.providers import AdapterContext
from ballast.providers.openai import OpenAIAdapter
from ballast.upstream.client import Upstream

CHAT = "/chat/completions"
BASE: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 20,
}


def scope(value: bytes | None = None) -> dict[str, Any]:
    return {"headers": [(b"x-ballast-cache", value)] if value is not None else []}


def test_header_and_body_field_choose_the_mode() -> None:
    assert mode_of(scope(), None) == DEFAULT
    assert mode_of(scope(b"off"), None) == OFF
    assert mode_of(scope(b"Refresh"), None) == REFRESH
    assert mode_of(scope(b"off"), True) == OFF  # the header wins
    assert mode_of(scope(), False) == OFF
    assert mode_of(scope(), "refresh") == REFRESH
    assert mode_of(scope(), {"no-cache": True}) == REFRESH
    assert mode_of(scope(), {"no-store": True}) == NO_STORE
    assert mode_of(scope(), {"no-cache": True, "no-store": True}) == OFF
    for bad_header, bad_field in ((b"sometimes", None), (None, 3), (None, {"no-cache": "yes"})):
        with pytest.raises(ApiError) as info:
            mode_of(scope(bad_header), bad_field)
        assert info.value.status == 400


def test_the_cache_field_is_never_forwarded() -> None:
    payload = {**BASE, "cache": {"no-cache": True}}
    request = RequestContext(CHAT, payload, orjson.dumps(payload), "chat", False)
    assert take_field(request) == {"no-cache": True}
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    adapter = OpenAIAdapter(deployment, upstream, AdapterContext())
    sent = orjson.loads(adapter.body(request, request.model))
    assert "cache" not in sent and sent == BASE
    assert scope_of(None, request) == "anonymous"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "chat", "messages": []}',
        b'  {"model":"chat","messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"chat"}',
    ],
)
def test_added_fields_are_spliced_into_the_clients_bytes(raw: bytes) -> None:
    payload = orjson.loads(raw)
    request = RequestContext(CHAT, payload, raw, "chat", False)
    request.edits["stream"] = True
    request.edits["stream_options"] = {"include_usage": True}
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    adapter = OpenAIAdapter(
        deployment, Upstream(deployment, Timeouts(), UpstreamSettings()), AdapterContext()
    )
    sent = adapter.body(request, "chat")
    assert orjson.loads(sent) == {
        **payload,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert sent.endswith(raw.strip()[1:])  # the client's own bytes, after the added fields


def test_a_body_with_a_field_to_replace_or_remove_is_encoded_again() -> None:
    payload = {"model": "chat", "stream": False, "fallbacks": ["x"]}
    raw = orjson.dumps(payload)
    request = RequestContext(CHAT, payload, raw, "chat", False)
    request.edits.update({"stream": True, "fallbacks": None})
    deployment = Deployment(id="d", url="http://127.0.0.1:9/v1")
    adapter = OpenAIAdapter(
        deployment, Upstream(deployment, Timeouts(), UpstreamSettings()), AdapterContext()
    )
    assert orjson.loads(adapter.body(request, "chat")) == {"model": "chat", "stream": True}

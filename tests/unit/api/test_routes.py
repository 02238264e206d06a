"""The one stage list, as a caller without a valid key meets it: every route checks the key
before it reads anything about the model, so a known and an unknown model name get the same
status and body (no route tells such a caller which models exist). Driven in process
through the app's ASGI callable (tests/unit/drive.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ballast.app import BallastApp
from ballast.resilience.clock import ManualClock
from tests.unit.drive import Client, settings_tree, started

MASTER = "sk-master-routes"
JSON = (b"content-type", b"application/json")


def _body(path: str, model: str) -> bytes:
    if path == "/v1/messages" or path == "/v1/messages/count_tokens":
        body: dict[str, Any] = {"model": model, "max_tokens": 8}
        body["messages"] = [{"role": "user", "content": "hi"}]
    elif path == "/v1/responses":
        body = {"model": model, "input": "hi"}
    elif path == "/v1/embeddings":
        body = {"model": model, "input": "hi"}
    elif path == "/v1/completions":
        body = {"model": model, "prompt": "hi"}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return orjson.dumps(body)


POSTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
# No key at all, a key that does not exist, and one in the Anthropic clients' header.
CALLERS = {
    "no key": [],
    "wrong key": [(b"authorization", b"Bearer sk-not-a-key")],
    "wrong x-api-key": [(b"x-api-key", b"sk-not-a-key")],
}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[BallastApp]:
    tree = settings_tree(tmp_path, "http://127.0.0.1:9/v1", master_key=MASTER)
    gateway = await started(tree, ManualClock())
    try:
        yield gateway
    finally:
        await gateway.shutdown()


async def _answer(
    app: BallastApp, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int | None, bytes]:
    client = Client(app, method, path, [body], headers=[JSON, *headers])
    await client.done()
    return client.status, b"".join(m.get("body", b"") for m in client.sent[1:])


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize("path", POSTS)
async def test_without_a_valid_key_a_known_and_an_unknown_model_look_the_same(
    app: BallastApp, path: str, caller: str
) -> None:
    headers = CALLERS[caller]
    known = await _answer(app, "POST", path, _body(path, "chat"), headers)
    unknown = await _answer(app, "POST", path, _body(path, "no-such-model"), headers)
    assert known == unknown
    assert known[0] == 401, known


@pytest.mark.parametrize("caller", sorted(CALLERS))
async def test_the_model_routes_do_not_tell_either(app: BallastApp, caller: str) -> None:
    headers = CALLERS[caller]
    known = await _answer(app, "GET", "/v1/models/chat", b"", headers)
    unknown = await _answer(app, "GET", "/v1/models/no-such-model", b"", headers)
    assert known == unknown and known[0] == 401
    listed = await _answer(app, "GET", "/v1/models", b"", headers)
    assert listed[0] == 401


async def test_with_the_key_the_unknown_model_is_told_apart(app: BallastApp) -> None:
    """The same routes, with a valid key: now an unknown model is a 404 in the route's
    shape, which shows the requests above reached the point where it would be."""
    headers = [(b"authorization", f"Bearer {MASTER}".encode())]
    for path in POSTS:
        status, body = await _answer(app, "POST", path, _body(path, "no-such-model"), headers)
        assert status == 404, (path, body)
        assert b"no-such-model" in body
    status, _ = await _answer(app, "GET", "/v1/models/no-such-model", b"", headers)
    assert status == 404


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize("first", [b'"model":"secret"', b'"mod\\u0065l":"secret"'])
async def test_a_read_field_given_twice_is_refused_in_the_routes_shape(
    app: BallastApp, path: str, first: bytes
) -> None:
    """Checked as one model, answered as another by an upstream that keeps the first pair:
    a 400 naming the field, in the route's own error shape."""
    headers = [(b"authorization", f"Bearer {MASTER}".encode())]
    body = b"{" + first + b"," + _body(path, "chat")[1:]
    status, answer = await _answer(app, "POST", path, body, headers)
    assert status == 400, (path, answer)
    error = orjson.loads(answer)
    if path.startswith("/v1/messages"):
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert "'model'" in error["error"]["message"]
    else:
        assert error["error"]["param"] == "model" and "'model'" in error["error"]["message"]

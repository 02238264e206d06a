"""Hostile input, fuzzed: any bytes into the request parser, the whole ASGI app, the SSE
parser and the config loader give a clear 4xx or a clean error, never a 500, a hang or an
exception escaping. Bounded: the whole file runs in well under 30 s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.api.openai import parse_request
from ballast.app import BallastApp
from ballast.config import ConfigError, parse_settings
from ballast.pipeline.errors import ApiError
from ballast.stream.event import NOT_JSON, read
from ballast.stream.state import StreamState
from ballast.upstream.sse import SseSplitter, event_data

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = [
    "model",
    "stream",
    "messages",
    "fallbacks",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "stream_options",
    "prompt",
    "input",
]
requests = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6)
PATHS = ["/chat/completions", "/completions", "/embeddings"]


# -- the request parser -------------------------------------------------------------------


@FAST
@given(st.binary(max_size=300), st.sampled_from(PATHS))
def test_any_bytes_parse_or_give_a_400(body: bytes, path: str) -> None:
    try:
        parse_request(path, body)
    except ApiError as error:
        assert error.status == 400


@FAST
@given(requests, st.sampled_from(PATHS))
def test_any_json_object_parses_or_names_the_bad_param(payload: dict[str, Any], path: str) -> None:
    try:
        request = parse_request(path, orjson.dumps(payload))
    except ApiError as error:
        assert error.status == 400
        assert error.param in (None, *KEYS)
        return
    assert isinstance(request.model, str) and request.model


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"[" * 5000 + b"]" * 5000, None),  # deeper than the JSON parser's 1024 levels
        (b'{"model": "m", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}", None),
        (b'{"model": "m\xff\xfe"}', None),  # invalid UTF-8
        (b'{"model": "m", "n": -1}', "n"),
        (b'{"model": "m", "n": 100000}', "n"),
        (b'{"model": "m", "n": true}', "n"),
        (b'{"model": "m", "max_tokens": -5}', "max_tokens"),
        (b'{"model": "m", "max_tokens": 1e300}', "max_tokens"),
        (b'{"model": "m", "max_tokens": 99999999999999999999}', "max_tokens"),  # > 64 bits
        (b'{"model": "m", "max_completion_tokens": "9"}', "max_completion_tokens"),
        (b'{"model": "m", "stream": "yes"}', "stream"),
        (b'{"model": "m", "fallbacks": "x"}', "fallbacks"),
        (b'{"model": 7}', "model"),
        (b"", None),
    ],
)
def test_hostile_bodies_are_400_naming_the_param(body: bytes, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        parse_request("/chat/completions", body)
    assert caught.value.status == 400
    assert caught.value.param == param


# -- the whole ASGI app, in process ---------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, BallastApp]]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    app = BallastApp(
        parse_settings(
            {
                "server": {"max_body_bytes": 4096, "body_timeout": 1.0},
                "state": {
                    "database_url": f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}",
                    "spend_journal": str(tmp / "spend.journal"),
                },
                "upstream": {"warm_connections": 0},
                "timeouts": {"connect": 0.2, "request": 1.0},
                "models": [
                    {
                        "name": "chat",
                        # Nothing listens there: a request that gets this far fails upstream.
                        "deployments": [{"id": "a", "url": "http://127.0.0.1:9/v1"}],
                    }
                ],
            },
            environ={},
        )
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.startup())
    try:
        yield loop, app
    finally:
        loop.run_until_complete(app.shutdown())
        loop.close()


async def _call(
    app: BallastApp,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    complete: bool = True,
) -> list[dict[str, Any]]:
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
    }
    pending = [
        {"type": "http.request", "body": c, "more_body": not complete or i < len(chunks) - 1}
        for i, c in enumerate(chunks or [b""])
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)  # the client is still there, sending nothing
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await asyncio.wait_for(app(scope, receive, send), 5)  # never a hang
    return sent


header_names = st.sampled_from(
    [b"content-type", b"authorization", b"x-request-id", b"content-length", b"api-key", b"x-a"]
)
header_values = st.binary(max_size=40) | st.sampled_from(
    [b"application/json", b"text/plain", b"multipart/form-data; boundary=x", b"Bearer x", b"-1"]
)
bodies = st.binary(max_size=200) | requests.map(orjson.dumps) | st.just(b'{"model":"chat"}')


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(["POST", "GET", "PUT", "OPTIONS", "DELETE"]),
    st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/admin/state",
            "/admin/../v1/models",
            "/nope",
            "/v1/chat/completions/../x",
        ]
    ),
    st.lists(st.tuples(header_names, header_values), max_size=4),
    st.lists(bodies, min_size=0, max_size=3),
)
def test_the_app_answers_anything_without_a_500(
    running: tuple[Any, BallastApp],
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
) -> None:
    loop, app = running
    sent = loop.run_until_complete(_call(app, method, path, headers, chunks))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1
    status = starts[0]["status"]
    assert status != 500 and status < 600
    if status >= 400:
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        error = orjson.loads(body)["error"]
        assert isinstance(error["message"], str) and error["type"]
    # Upstream trouble (nothing listens) is a 5xx of the taxonomy, never a crash.
    assert status < 500 or status in (502, 503, 504)


def test_the_app_rejects_non_json_content_types_with_415(running: tuple[Any, BallastApp]) -> None:
    loop, app = running
    for kind in (b"application/x-www-form-urlencoded", b"text/plain", b"multipart/form-data"):
        sent = loop.run_until_complete(
            _call(app, "POST", "/v1/chat/completions", [(b"content-type", kind)], [b"model=x"])
        )
        assert sent[0]["status"] == 415
        assert orjson.loads(sent[1]["body"])["error"]["code"] == "unsupported_media_type"
    for kind in (b"application/json; charset=utf-8", b"application/vnd.api+json", None):  # type: ignore[assignment]
        headers = [(b"content-type", kind)] if kind else []
        sent = loop.run_until_complete(
            _call(app, "POST", "/v1/chat/completions", headers, [b'{"model":"none"}'])
        )
        assert sent[0]["status"] == 404  # read as JSON: the model is unknown


def test_an_oversized_body_is_413_and_a_trickled_one_408(running: tuple[Any, BallastApp]) -> None:
    loop, app = running
    sent = loop.run_until_complete(
        _call(app, "POST", "/v1/chat/completions", [], [b"x" * 3000, b"x" * 3000])
    )
    assert sent[0]["status"] == 413
    sent = loop.run_until_complete(
        _call(app, "POST", "/v1/chat/completions", [], [b"{", b'"model"'], complete=False)
    )
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    assert app.in_flight == 0


# -- the SSE parser -----------------------------------------------------------------------


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_the_sse_splitter_takes_any_bytes_in_any_pieces(data: bytes, cuts: list[int]) -> None:
    whole = SseSplitter()
    expected = whole.feed(data)
    expected_rest = whole.rest()
    pieces = SseSplitter()
    got: list[bytes] = []
    last = 0
    for cut in sorted(cuts):
        got.extend(pieces.feed(data[last:cut]))
        last = max(last, cut)
    got.extend(pieces.feed(data[last:]))
    # The same events whatever the chunking (a CR split from its LF too).
    assert got == expected
    assert pieces.rest() == expected_rest
    for event in got:
        found = event_data(event)
        assert found is None or isinstance(found, bytes)


sse_lines = st.lists(
    st.sampled_from(
        [
            b"data: ",
            b"data:",
            b"event: x",
            b": comment",
            b"\n",
            b"\r\n",
            b"\n\n",
            b"[DONE]",
            b'{"choices":[{"delta":{"content":"a"}}]}',
            b'{"error":{}}',
            b"{",
            b"\xff",
            b"id: 1",
        ]
    ),
    max_size=20,
).map(b"".join)


@FAST
@given(sse_lines)
def test_sse_event_data_never_fails(data: bytes) -> None:
    splitter = SseSplitter()
    state = StreamState()
    for event in [*splitter.feed(data), splitter.rest()]:
        payload = read(event).json
        if payload is NOT_JSON:
            state.malformed += 1
        else:
            state.observe(payload)


@FAST
@given(json_values)
def test_stream_state_observes_any_json(payload: Any) -> None:
    state = StreamState()
    state.observe(payload)
    state.observe({"choices": [payload], "usage": payload})
    state.observe({"choices": [{"delta": payload, "text": payload, "finish_reason": payload}]})
    assert isinstance(state.content, str)


# -- the config loader --------------------------------------------------------------------

config_keys = st.sampled_from(
    [
        "models",
        "server",
        "timeouts",
        "state",
        "routing",
        "upstream",
        "name",
        "deployments",
        "id",
        "url",
        "api_key",
        "port",
        "fallbacks",
        "max_in_flight",
        "${X}",
        "prices",
    ]
)
config_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["${HOME}", "${NOPE}", "${NOPE:-x}", "http://h:1/v1", "-1", "1e999"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(config_keys, inner, max_size=4),
    max_leaves=25,
)


@FAST
@given(config_values)
def test_any_config_tree_is_settings_or_a_config_error(tree: Any) -> None:
    try:
        parse_settings(tree, environ={"HOME": "/h", "X": "y"})
    except ConfigError as error:
        assert error.errors and all(isinstance(line, str) and line for line in error.errors)


@FAST
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": st.text(max_size=6),
                "deployments": st.lists(
                    st.fixed_dictionaries({"id": st.text(max_size=4), "url": st.text(max_size=20)}),
                    max_size=2,
                ),
            },
            optional={"fallbacks": st.lists(st.text(max_size=4), max_size=2)},
        ),
        max_size=3,
    )
)
def test_model_lists_validate_or_name_the_problem(models: list[dict[str, Any]]) -> None:
    try:
        parse_settings({"models": models}, environ={})
    except ConfigError as error:
        assert all(":" in line for line in error.errors)

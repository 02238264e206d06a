"""A body giving a field Ballast reads twice is refused; everything else may repeat."""

from __future__ import annotations

import orjson
import pytest

from ballast.pipeline.duplicate_keys import DuplicateKeys
from ballast.pipeline.errors import ApiError

CHECK = DuplicateKeys(("model", "max_tokens", "n"))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"model":"secret","max_tokens":999999,"model":"a","max_tokens":5}', "model"),
        (b'{"max_tokens":999999,"messages":[],"max_tokens":5}', "max_tokens"),
        (b'{"n" : 128, "n": 1}', "n"),
        (b'{"model":"secret","mod\\u0065l":"a"}', "model"),  # the same name, escaped
        (b'{"m\\u006fdel":"secret","mod\\u0065l":"a"}', "model"),
    ],
)
def test_a_read_field_given_twice_is_a_400_naming_it(body: bytes, field: str) -> None:
    with pytest.raises(ApiError) as error:
        CHECK.check(body, orjson.loads(body))
    assert (error.value.status, error.value.param) == (400, field)
    assert f"'{field}'" in error.value.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"a","messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"a","metadata":{"x":1},"metadata":{"x":2}}',  # not a field Ballast reads
        b'{"model":"model","tools":[{"parameters":{"model":{},"n":{}}},{"model":1,"n":2}]}',
        b'{"model":"a","messages":[{"content":"\\"model\\": \\u00e9\\n"}]}',
        b'{"model":"a","input":"\\u0065scaped, but no name twice"}',
    ],
)
def test_repeats_elsewhere_pass(body: bytes) -> None:
    CHECK.check(body, orjson.loads(body))


def test_a_body_too_deep_to_look_closer_at_is_a_400() -> None:
    body = b'{"model":"a","deep":' + b"[" * 5000 + b"]" * 5000 + b',"model":"b"}'
    with pytest.raises(ApiError) as error:
        CHECK.check(body, {"model": "b", "deep": []})  # as a parser with no depth limit reads it
    assert error.value.status == 400

"""The request's headers a shape forwards upstream, as the client sent them."""

from __future__ import annotations

from ballast.pipeline.reading import forwarded

NAMES = (b"anthropic-version", b"anthropic-beta")


def test_only_the_named_headers_are_forwarded_and_repeats_are_joined_in_order() -> None:
    scope = {
        "headers": [
            (b"anthropic-beta", b"b1"),
            (b"x-api-key", b"sk-secret"),
            (b"anthropic-version", b"2023-06-01"),
            (b"anthropic-beta", b"b2,b3"),
        ]
    }
    assert forwarded(scope, NAMES) == (
        ("anthropic-beta", "b1,b2,b3"),
        ("anthropic-version", "2023-06-01"),
    )


def test_a_request_without_them_forwards_nothing() -> None:
    assert forwarded({"headers": [(b"content-type", b"application/json")]}, NAMES) == ()

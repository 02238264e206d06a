"""Who may use the admin API: the master key may do anything, the dashboard token may only
read; a wrong credential counts against its address, which is locked out for a while after
too many (resilience/lockout.py). Also the headers that keep admin answers out of other
sites' frames."""

from __future__ import annotations

import hmac
import math
from typing import Any
from urllib.parse import parse_qs

from ballast.config import ServerSettings
from ballast.pipeline.asgi import Scope, Send, header
from ballast.pipeline.errors import ApiError
from ballast.resilience.lockout import Lockout
from ballast.types import Message

MASTER_KEY, DASHBOARD_TOKEN = "master_key", "dashboard_token"
# Where a request's admin credential is named for the handlers (`master_key` or
# `dashboard_token`): the audit log's "who", the UI's role.
ACTOR = "ballast.admin_actor"
# On every admin answer and page: never framed (clickjacking), never sniffed, not cached.
SECURITY_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"referrer-policy", b"no-referrer"),
]
# The part of them every JSON answer gets too.
UNFRAMED = SECURITY_HEADERS[2:4]


def _token(scope: Scope, write: bool) -> str | None:
    """The admin credential: the Authorization header; for reads only, also `?token=` (the
    dashboard's link). A write never takes it from the query string, where a page of
    another site could put it (and where logs and histories keep it)."""
    value = header(scope, b"authorization")
    if value is not None:
        text = value.decode("latin-1").strip()
        if text[:7].lower() == "bearer ":
            return text[7:].strip() or None
        return None
    if write:
        return None
    query = scope.get("query_string") or b""
    if not write and b"token=" in query:
        tokens: list[str] | None = parse_qs(query.decode("latin-1")).get("token")
        if tokens:
            return tokens[0]
    return None


def _secret(value: Any) -> str | None:
    """A configured secret, or None when unset or empty (`${VAR:-}` with VAR unset)."""
    if value is None:
        return None
    text: str = value.get_secret_value()
    return text or None


def _same(given: str, secret: Any) -> bool:
    expected = _secret(secret)
    if expected is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def unframed(send: Send) -> Send:
    """`send`, with the headers that keep an answer out of other sites' frames."""

    async def framed(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *UNFRAMED]}
        await send(message)

    return framed


def authorize(scope: Scope, write: bool, server: ServerSettings, lockout: Lockout) -> str:
    """Which credential the request gave (MASTER_KEY or DASHBOARD_TOKEN); a 401, 403 or
    429 ApiError otherwise."""
    if _secret(server.master_key) is None and (write or _secret(server.dashboard_token) is None):
        raise ApiError(
            403,
            "The admin API is disabled: set server.master_key in the config.",
            "permission_error",
            "admin_disabled",
        )
    lockout.limit, lockout.window = server.admin_failure_limit, server.admin_lockout
    client = scope.get("client")
    caller = str(client[0]) if client else ""
    wait = lockout.retry_after(caller)
    if wait > 0:
        raise ApiError(
            429,
            "Too many wrong admin keys from this address; retry later.",
            "rate_limit_error",
            "admin_locked_out",
            headers=((b"retry-after", str(math.ceil(wait)).encode()),),
        )
    given = _token(scope, write)
    if given is None:
        raise _unauthorized("You didn't provide the admin key (Authorization: Bearer <key>).")
    if _same(given, server.master_key):
        lockout.succeeded(caller)
        return MASTER_KEY
    if not write and _same(given, server.dashboard_token):
        lockout.succeeded(caller)
        return DASHBOARD_TOKEN
    lockout.failed(caller)
    raise _unauthorized("Incorrect admin key provided.")

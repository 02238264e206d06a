"""Secrets never shown: the resolved config as data with every secret masked, and URLs
with their passwords and secret query values masked (for logs and the terminal)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, AnyStr

from pydantic import BaseModel, SecretStr

if TYPE_CHECKING:
    from ballast.config.settings import Settings

MASK = "****"
# A configured secret shorter than this is not searched for in text: it would mask words.
MIN_SCRUBBED = 8
# A field is secret when its name says so, wherever it sits (provider credentials included).
_SECRET_NAME = re.compile(
    r"(^|[_-])(api[_-]?key|key|secret|token|password|passwd|credentials?|authorization|auth"
    r"|cookie|signature|sig|private[_-]?key|session[_-]?token|access[_-]?key(_id)?)$",
    re.IGNORECASE,
)
# Secret values inside a URL: its user:password and query parameters named like secrets.
_URL_USERINFO = re.compile(r"(://[^:/@\s]*):([^@/\s]*)@")
_URL_QUERY_SECRET = re.compile(
    r"([?&](?:[a-z0-9_-]*(?:key|token|secret|password|sig|signature|auth)[a-z0-9_-]*)=)([^&#\s]*)",
    re.IGNORECASE,
)


def mask_url(text: str) -> str:
    """A URL (or any text holding one) with its password and secret query values masked."""
    if "://" in text:
        text = _URL_USERINFO.sub(rf"\1:{MASK}@", text)
    if "=" in text:
        text = _URL_QUERY_SECRET.sub(rf"\1{MASK}", text)
    return text


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def _mask_tree(value: Any, name: str = "") -> Any:
    if isinstance(value, dict):
        if name == "headers":
            # Custom headers carry credentials under any name (x-goog-api-key, api-key,
            # proxy-authorization, ...): none of their values is shown.
            return {k: MASK for k in value}
        return {k: _mask_tree(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_tree(v, name) for v in value]
    if isinstance(value, str) and value:
        if is_secret_name(name) or name == "proxy":
            return MASK
        return mask_url(value)
    return value


def masked(settings: Settings) -> dict[str, Any]:
    """The resolved config as plain data, with every secret replaced by a mask: fields named
    like secrets, every custom header's value, and passwords and secret query parameters in
    URLs, wherever they are."""
    data: dict[str, Any] = _mask_tree(settings.model_dump(mode="json"))
    return data


def scrub(text: AnyStr, secrets: Iterable[AnyStr], mask: AnyStr) -> AnyStr:
    """`text` with every occurrence of each of `secrets` replaced by `mask`."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, mask)
    return text


def secret_values(settings: Settings) -> frozenset[str]:
    """Every secret the config holds, as its value: the master key and dashboard token, the
    deployments' and job backends' credentials, every custom header's value (and the token
    in an `Authorization`-style one), fields named like secrets. What an upstream echoes
    back, or a log line carries, is scrubbed of these."""
    found: set[str] = set()
    _collect(settings, "", found)
    return frozenset(value for value in found if len(value) >= MIN_SCRUBBED)


def _collect(value: Any, name: str, found: set[str]) -> None:
    if isinstance(value, SecretStr):
        text = value.get_secret_value()
        found.add(text)
        _collect_in_url(text, found)
    elif isinstance(value, BaseModel):
        for field in type(value).model_fields:
            _collect(getattr(value, field), field, found)
    elif isinstance(value, dict):
        for key, item in value.items():
            if name == "headers" and isinstance(item, str | SecretStr):
                text = item.get_secret_value() if isinstance(item, SecretStr) else item
                found.add(text)
                scheme, _, token = text.partition(" ")
                if token and scheme.lower() in ("bearer", "basic", "token"):
                    found.add(token.strip())
            else:
                _collect(item, str(key), found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, name, found)
    elif isinstance(value, str) and value:
        if is_secret_name(name):
            found.add(value)
        _collect_in_url(value, found)


def _collect_in_url(text: str, found: set[str]) -> None:
    """A URL's password and its secret query values (a key given as `?key=`)."""
    if "://" in text:
        found.update(match.group(2) for match in _URL_USERINFO.finditer(text))
    if "=" in text:
        found.update(match.group(2) for match in _URL_QUERY_SECRET.finditer(text))

"""`GET /dashboard`: one static page (inline CSS and JS, no build step) that polls
`/admin/state` and `/admin/events` every second with the token it was opened with."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def page() -> bytes:
    return resources.files("ballast.api").joinpath("static/dashboard.html").read_bytes()

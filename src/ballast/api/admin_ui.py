"""`GET /ui`: the admin UI, three static files shipped in the package (no build step, no
network). The page holds no data and needs no credential to load: the operator signs in
in the page, which keeps the credential in sessionStorage and sends it in the
Authorization header of each call to `/admin/*` (never a cookie, so no other site's page
can make the browser send it). The policy allows only this origin's script, style and
calls, and forbids framing."""

from __future__ import annotations

from functools import cache
from importlib import resources

from ballast.api.admin_auth import SECURITY_HEADERS
from ballast.pipeline.asgi import Receive, Scope, Send, send_bytes

POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# path -> (file in static/, content type)
UI_FILES = {
    "/ui": ("admin.html", b"text/html; charset=utf-8"),
    "/ui/admin.js": ("admin.js", b"text/javascript; charset=utf-8"),
    "/ui/admin.css": ("admin.css", b"text/css; charset=utf-8"),
}
_HEADERS = [
    *(item for item in SECURITY_HEADERS if item[0] != b"content-security-policy"),
    (b"content-security-policy", POLICY),
]


@cache
def _read(name: str) -> bytes:
    return resources.files("ballast.api").joinpath("static", name).read_bytes()


async def ui_file(scope: Scope, receive: Receive, send: Send) -> None:
    name, content_type = UI_FILES[scope["path"]]
    await send_bytes(send, 200, [(b"content-type", content_type), *_HEADERS], _read(name))

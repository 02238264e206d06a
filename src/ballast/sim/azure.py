"""The simulator on Azure OpenAI's URLs. The wire is OpenAI's (the app's handlers answer);
what Azure adds is checked here first: the `api-key` header (or a bearer token), and the
`api-version` query, required on the classic `/openai/deployments/{deployment}/...` paths
and optional on the `/openai/v1/` API. Errors come in Azure's shape."""

from __future__ import annotations

from aiohttp import web

from ballast.sim.admin import json_response

CLASSIC_PATHS = ("chat/completions", "completions", "embeddings")


def _error(status: int, code: str, message: str) -> web.Response:
    return json_response({"error": {"code": code, "message": message}}, status)


def refusal(request: web.Request, classic: bool) -> web.Response | None:
    """Azure's answer to a request it would not serve, or None to go on."""
    bearer = request.headers.get("authorization", "").startswith("Bearer ")
    if not request.headers.get("api-key") and not bearer:
        return _error(
            401,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint (sim).",
        )
    if classic and not request.query.get("api-version"):
        return _error(404, "404", "Resource not found (sim: api-version is missing)")
    return None


def deployment_of(request: web.Request) -> str:
    """The deployment a classic path names: the model when the body names none."""
    return request.match_info["deployment"]

"""Runtime control of the simulator: behaviour rules, the attempt log and stats.

``PUT /sim/behaviour {"model": name-or-*, "behaviour": spec}`` sets a rule (fresh
once/flap/random state); ``DELETE /sim/behaviour[?model=name]`` clears one or all rules;
``GET /sim/behaviour`` lists them. ``GET|DELETE /sim/log`` and ``GET /sim/stats``.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ballast.sim.bodies import error_body
from ballast.sim.state import SIM_STATE, WILDCARD


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def invalid_request(
    message: str, param: str | None = None, code: str | None = None
) -> web.Response:
    """A 400 with an OpenAI-style ``invalid_request_error`` body."""
    return json_response(error_body(message, "invalid_request_error", code, param), 400)


async def _get_behaviour(request: web.Request) -> web.Response:
    return json_response(request.app[SIM_STATE].describe_rules())


async def _put_behaviour(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return invalid_request("body must be JSON")
    if not isinstance(body, dict):
        return invalid_request("body must be a JSON object")
    model = body.get("model", WILDCARD)
    spec = body.get("behaviour")
    if not isinstance(model, str) or not model:
        return invalid_request("'model' must be a model name or '*'", "model")
    if not isinstance(spec, str):
        return invalid_request("'behaviour' must be a behaviour spec string", "behaviour")
    try:
        rule = state.set_rule(model, spec)
    except ValueError as exc:
        return invalid_request(str(exc), "behaviour", "invalid_behaviour")
    return json_response({"model": model, "behaviour": rule.behaviour.spec})


async def _delete_behaviour(request: web.Request) -> web.Response:
    model = request.query.get("model")
    return json_response({"cleared": request.app[SIM_STATE].clear_rules(model)})


async def _get_log(request: web.Request) -> web.Response:
    return json_response({"attempts": list(request.app[SIM_STATE].attempts)})


async def _delete_log(request: web.Request) -> web.Response:
    return json_response({"cleared": request.app[SIM_STATE].clear_log()})


async def _stats(request: web.Request) -> web.Response:
    return json_response(request.app[SIM_STATE].stats())


def add_admin_routes(app: web.Application) -> None:
    app.router.add_get("/sim/behaviour", _get_behaviour)
    app.router.add_put("/sim/behaviour", _put_behaviour)
    app.router.add_delete("/sim/behaviour", _delete_behaviour)
    app.router.add_get("/sim/log", _get_log)
    app.router.add_delete("/sim/log", _delete_log)
    app.router.add_get("/sim/stats", _stats)

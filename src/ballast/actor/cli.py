"""``ballast actor``: the command function (registered by :mod:`ballast.cli`)."""

from __future__ import annotations

import logging
import os
import sys

import typer

from ballast.actor.app import normalise_backend_url

CONTROL_SECRET_ENV = "BALLAST_ACTOR_CONTROL_SECRET"
JWT_SECRET_ENV = "BALLAST_ACTOR_JWT_SECRET"
BACKEND_API_KEY_ENV = "BALLAST_ACTOR_BACKEND_API_KEY"
MIN_JWT_SECRET_BYTES = 32


def _fail(message: str) -> typer.Exit:
    typer.echo(f"ballast actor: {message}", err=True)
    return typer.Exit(2)


def actor_command(backend: str, port: int, host: str, idle_timeout: float, jwt_ttl: float) -> None:
    """Run the reference sampling actor in front of the inference server at ``backend``.

    Secrets come from the environment: ``BALLAST_ACTOR_CONTROL_SECRET`` (bearer for
    ``/runs``) and ``BALLAST_ACTOR_JWT_SECRET`` (signs run tokens), both required;
    ``BALLAST_ACTOR_BACKEND_API_KEY`` (optional) is sent to the backend.
    Exits 2 with a message when something is missing or invalid.
    """
    control_secret = os.environ.get(CONTROL_SECRET_ENV, "")
    jwt_secret = os.environ.get(JWT_SECRET_ENV, "")
    required = ((CONTROL_SECRET_ENV, control_secret), (JWT_SECRET_ENV, jwt_secret))
    missing = [name for name, value in required if not value]
    if missing:
        raise _fail(f"set {' and '.join(missing)} in the environment (required)")
    try:
        normalise_backend_url(backend)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if not idle_timeout > 0:
        raise _fail("--idle-timeout must be a positive number of seconds")
    if not jwt_ttl > 0:
        raise _fail("--jwt-ttl must be a positive number of seconds")
    if not 0 <= port <= 65535:
        raise _fail("--port must be between 0 and 65535")
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s %(message)s",
            stream=sys.stderr,
        )
    if len(jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
        logging.getLogger(__name__).warning(
            "%s is shorter than %d bytes; use a longer random secret",
            JWT_SECRET_ENV,
            MIN_JWT_SECRET_BYTES,
        )
    from ballast.actor.server import run_actor
    from ballast.server.aioweb import CannotListen

    try:
        run_actor(
            backend,
            host,
            port,
            idle_timeout,
            jwt_ttl,
            control_secret=control_secret,
            jwt_secret=jwt_secret,
            backend_api_key=os.environ.get(BACKEND_API_KEY_ENV) or None,
        )
    except CannotListen as exc:
        typer.echo(f"ballast actor: {exc.strerror}", err=True)
        raise typer.Exit(1) from None

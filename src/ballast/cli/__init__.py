"""The `ballast` command: serving, the simulator, the sampling actor and the demo here; the
administration of the database, keys and teams in `keys.py`."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from ballast.cli.common import runnable_or_exit
from ballast.cli.keys import db_cli, keys_cli, teams_cli
from ballast.config import masked

cli = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Ballast: a self-healing LLM gateway."
)
cli.add_typer(db_cli, name="db")
cli.add_typer(keys_cli, name="keys")
cli.add_typer(teams_cli, name="teams")


def _print_version(wanted: bool) -> None:
    if wanted:
        from ballast import __version__

        typer.echo(f"ballast {__version__}")
        raise typer.Exit()


@cli.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Ballast: a self-healing LLM gateway."""


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


@cli.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="YAML config file")]) -> None:
    """Print the resolved config with secrets masked, or every error with its path (exit 2):
    a missing optional extra too, with the command that installs it."""
    settings = runnable_or_exit(config)
    typer.echo(yaml.safe_dump(masked(settings), sort_keys=False))


def _startup_line(
    settings: Any, host: str, port: int | None, workers: int, tls: Path | None
) -> None:
    """One line saying what is about to serve: where, how many workers, which models and
    state backends (secrets masked). Printed with one worker too."""
    from ballast.config import mask_url

    state = settings.state
    scheme = "https" if tls else "http"
    bound = settings.server.port if port is None else port
    shown_host = f"[{host}]" if ":" in host else host
    models = ", ".join(g.name for g in settings.models)
    redis = mask_url(state.redis_url) if state.redis_url else "none (local fallbacks)"
    logging.getLogger("ballast.serve").info(
        "Ballast serving on %s://%s:%d with %d worker%s; models: %s; database: %s; redis: %s",
        scheme,
        shown_host,
        bound,
        workers,
        "" if workers == 1 else "s",
        models[:500],
        mask_url(state.database_url),
        redis,
    )


@cli.command()
def serve(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML config file")],
    host: Annotated[str | None, typer.Option(help="overrides server.host")] = None,
    port: Annotated[int | None, typer.Option(help="overrides server.port")] = None,
    workers: Annotated[int, typer.Option(help="worker processes sharing the port")] = 1,
    reuse_port: Annotated[
        bool,
        typer.Option(
            help="with several workers on Linux, a listening socket per worker (SO_REUSEPORT): "
            "the kernel spreads connections evenly; off: one shared socket, where a burst "
            "of connections can all land on one worker"
        ),
    ] = True,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
    log_format: Annotated[str, typer.Option(help="json (one object a line) or text")] = "text",
    proxy_headers: Annotated[
        bool,
        typer.Option(
            help="trust X-Forwarded-For/-Proto from a reverse proxy on this host "
            "(off: requests skip that work)"
        ),
    ] = False,
    grace: Annotated[
        float | None,
        typer.Option(help="seconds SIGTERM lets requests finish (overrides server.shutdown_grace)"),
    ] = None,
    ssl_certfile: Annotated[
        Path | None, typer.Option(help="serve HTTPS with this PEM certificate (chain)")
    ] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="the certificate's PEM key")] = None,
) -> None:
    """Run the gateway."""
    import uvicorn

    from ballast.observe import prepare_serve
    from ballast.server.serving import run_server

    if (ssl_certfile is None) != (ssl_keyfile is None):
        typer.echo("--ssl-certfile and --ssl-keyfile go together", err=True)
        raise typer.Exit(2)

    settings = runnable_or_exit(config)
    prepare_serve(log_level, log_format, workers)
    _startup_line(settings, host or settings.server.host, port, workers, ssl_certfile)
    os.environ["BALLAST_CONFIG"] = str(config.resolve())
    os.environ["BALLAST_WORKERS"] = str(workers)  # workers share rate limits when several
    # uvicorn re-raises SIGTERM/SIGINT once its graceful shutdown is over; by then everything
    # has been flushed, so the re-raised signal ends the command normally (exit 0).
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda signum, frame: None)
    config_ = uvicorn.Config(
        "ballast.app:app_from_env",
        factory=True,
        http="ballast.server.protocol:GuardedHttpToolsProtocol",
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        workers=workers,
        loop="ballast.server.accept:GatewayLoop",  # uvloop, accepting in batches
        lifespan="on",
        access_log=False,
        proxy_headers=proxy_headers,
        server_header=False,
        log_level=log_level if log_level != "info" else "warning",
        timeout_keep_alive=max(1, round(settings.server.keepalive_timeout)),
        timeout_graceful_shutdown=math.ceil(
            settings.server.shutdown_grace if grace is None else grace
        ),
        ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
        ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
    )
    run_server(config_, reuse_port)


@cli.command()
def sim(
    port: Annotated[int, typer.Option(help="port to listen on")] = 9000,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    default: Annotated[
        str, typer.Option(help="default behaviour spec, e.g. 'ok?tokens=32'")
    ] = "ok",
    name: Annotated[str, typer.Option(help="name shown in logs")] = "sim",
) -> None:
    """Run the fault-injecting OpenAI-compatible simulator."""
    from ballast.server.aioweb import CannotListen
    from ballast.sim.server import run_sim

    _setup_logging("info")
    try:
        run_sim(host, port, default, name)
    except CannotListen as exc:
        typer.echo(f"ballast sim: {exc.strerror}", err=True)
        raise typer.Exit(1) from None


@cli.command()
def actor(
    backend: Annotated[str, typer.Option(help="the inference server's base URL")],
    port: Annotated[int, typer.Option(help="port to listen on")] = 8100,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    idle_timeout: Annotated[
        float, typer.Option(help="seconds before an idle run is reclaimed")
    ] = 900.0,
    jwt_ttl: Annotated[float, typer.Option(help="seconds a run token lives")] = 3600.0,
) -> None:
    """Run the reference sampling actor (secrets from BALLAST_ACTOR_CONTROL_SECRET and
    BALLAST_ACTOR_JWT_SECRET)."""
    from ballast.actor.cli import actor_command

    _setup_logging("info")
    actor_command(backend, port, host, idle_timeout, jwt_ttl)


@cli.command()
def demo(
    seconds: Annotated[float, typer.Option(help="how long the workload runs")] = 40.0,
) -> None:
    """Start two simulated upstreams and the gateway, inject faults, and show them survived."""
    import asyncio

    from ballast.demo import run_demo

    _setup_logging("error")
    code = asyncio.run(run_demo(seconds))
    raise typer.Exit(code)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()

"""The `ballast` command."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from ballast.config import ConfigError, load_settings, masked

cli = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Ballast: a self-healing LLM gateway."
)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _load_or_exit(config: Path):  # type: ignore[no-untyped-def]
    try:
        return load_settings(config)
    except ConfigError as exc:
        for line in exc.errors:
            typer.echo(line, err=True)
        raise typer.Exit(2) from None


@cli.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="YAML config file")]) -> None:
    """Print the resolved config with secrets masked, or every error with its path (exit 2)."""
    settings = _load_or_exit(config)
    typer.echo(yaml.safe_dump(masked(settings), sort_keys=False))


@cli.command()
def serve(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML config file")],
    host: Annotated[str | None, typer.Option(help="overrides server.host")] = None,
    port: Annotated[int | None, typer.Option(help="overrides server.port")] = None,
    workers: Annotated[int, typer.Option(help="worker processes sharing the port")] = 1,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
) -> None:
    """Run the gateway."""
    import uvicorn

    settings = _load_or_exit(config)
    _setup_logging(log_level)
    os.environ["BALLAST_CONFIG"] = str(config.resolve())
    uvicorn.run(
        "ballast.app:app_from_env",
        factory=True,
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level if log_level != "info" else "warning",
        timeout_keep_alive=30,
    )


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
    from ballast.sim.server import run_sim

    _setup_logging("info")
    run_sim(host, port, default, name)


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

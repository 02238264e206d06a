"""The `ballast` command."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import yaml

from ballast.config import ConfigError, load_settings, masked
from ballast.resilience.clock import SYSTEM_CLOCK

if TYPE_CHECKING:
    from ballast.state.hub import StateHub

T = TypeVar("T")

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

    settings = _load_or_exit(config)
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


db_cli = typer.Typer(no_args_is_help=True, help="The database: migrations.")
keys_cli = typer.Typer(no_args_is_help=True, help="Virtual API keys.")
cli.add_typer(db_cli, name="db")
cli.add_typer(keys_cli, name="keys")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="YAML config file")]


def _with_state(config: Path, work: Callable[[StateHub], Awaitable[T]]) -> T:
    """Run `work(hub)` against the configured database, migrated first."""
    import asyncio

    from ballast.state.hub import StateHub

    settings = _load_or_exit(config)

    from ballast.api.fleet import announce_key_changes

    async def run() -> T:
        hub = StateHub(settings)
        announce_key_changes(hub)  # a key revoked here reaches every running gateway
        try:
            await hub.db.upgrade()
            return await work(hub)
        finally:
            if hub.store is not None:
                await hub.store.close()
            await hub.db.close()

    return asyncio.run(run())


@db_cli.command("upgrade")
def db_upgrade(config: ConfigOption) -> None:
    """Apply every pending migration (the gateway also does this at start-up)."""

    async def work(hub: StateHub) -> Any:
        return None

    _with_state(config, work)
    typer.echo("database is up to date")


@keys_cli.command("create")
def keys_create(
    config: ConfigOption,
    name: Annotated[str, typer.Option(help="who or what the key is for")],
    models: Annotated[str | None, typer.Option(help="comma-separated allowed models")] = None,
    rpm: Annotated[int | None, typer.Option(help="requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="tokens per minute")] = None,
    max_parallel: Annotated[int | None, typer.Option(help="parallel requests")] = None,
    budget: Annotated[float | None, typer.Option(help="dollars per budget period")] = None,
    budget_period: Annotated[str, typer.Option(help="day, month or total")] = "month",
    expires_in_days: Annotated[float | None, typer.Option(help="expiry from now")] = None,
    max_jobs: Annotated[int | None, typer.Option(help="concurrent GPU jobs")] = None,
    team: Annotated[str | None, typer.Option(help="the id of the team it belongs to")] = None,
) -> None:
    """Create a key; it is printed once and stored only as a hash."""
    from ballast.api.key_fields import key_options
    from ballast.pipeline.errors import ApiError

    data = {
        "name": name,
        "models": [m.strip() for m in models.split(",") if m.strip()] if models else None,
        "rpm": rpm,
        "tpm": tpm,
        "max_parallel": max_parallel,
        "budget": budget,
        "budget_period": budget_period,
        "expires_at": SYSTEM_CLOCK.time() + expires_in_days * 86400 if expires_in_days else None,
        "max_concurrent_jobs": max_jobs,
        "team_id": team,
    }
    try:
        options = key_options(data)
    except ApiError as error:
        typer.echo(error.message, err=True)
        raise typer.Exit(2) from None

    async def work(hub: StateHub) -> Any:
        return await hub.keys.create(**options)

    plaintext, record = _with_state(config, work)
    typer.echo(f"id:  {record.id}\nkey: {plaintext}\n(store it now: it is not shown again)")


@keys_cli.command("list")
def keys_list(config: ConfigOption) -> None:
    """List keys with their limits and spend this period (never the keys themselves)."""
    from ballast.state.spend import period_of

    async def work(hub: StateHub) -> Any:
        rows = []
        for record in await hub.keys.list():
            period = period_of(record.budget_period, hub.clock.time())
            rows.append((record, period, await hub.spend.key_spend(record.id, period)))
        return rows

    for record, period, spent in _with_state(config, work):
        state = "revoked" if record.revoked else "active"
        models = ",".join(record.models) if record.models is not None else "*"
        limits = " ".join(
            f"{name}={value}"
            for name, value in (
                ("rpm", record.rpm),
                ("tpm", record.tpm),
                ("parallel", record.max_parallel),
                ("budget", record.budget),
                ("team", record.team_id),
            )
            if value is not None
        )
        typer.echo(
            f"{record.id}  {state:7}  {record.name}  models={models}  {limits}  "
            f"spend({period})={spent:.6f}"
        )


def _key_data(**given: Any) -> dict[str, Any]:
    """The options given on the command line, as the admin API takes them."""
    data = {k: v for k, v in given.items() if v is not None}
    if "models" in data:
        data["models"] = [m.strip() for m in data["models"].split(",") if m.strip()]
    return data


def _checked(check: Callable[[dict[str, Any]], dict[str, Any]], data: dict[str, Any]) -> Any:
    from ballast.pipeline.errors import ApiError

    try:
        return check(data)
    except ApiError as error:
        typer.echo(error.message, err=True)
        raise typer.Exit(2) from None


@keys_cli.command("update")
def keys_update(
    config: ConfigOption,
    key_id: Annotated[str, typer.Argument()],
    models: Annotated[str | None, typer.Option(help="comma-separated allowed models")] = None,
    rpm: Annotated[int | None, typer.Option(help="requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="tokens per minute")] = None,
    max_parallel: Annotated[int | None, typer.Option(help="parallel requests")] = None,
    budget: Annotated[float | None, typer.Option(help="dollars per budget period")] = None,
    budget_period: Annotated[str | None, typer.Option(help="day, month or total")] = None,
    expires_in_days: Annotated[float | None, typer.Option(help="expiry from now")] = None,
    team: Annotated[str | None, typer.Option(help="the team's id")] = None,
    clear: Annotated[
        str | None, typer.Option(help="comma-separated fields to clear, e.g. rpm,budget")
    ] = None,
) -> None:
    """Change a key's limits, budget, models, expiry or team."""
    from ballast.api.key_fields import key_changes

    data = _key_data(
        models=models,
        rpm=rpm,
        tpm=tpm,
        max_parallel=max_parallel,
        budget=budget,
        budget_period=budget_period,
        expires_at=SYSTEM_CLOCK.time() + expires_in_days * 86400 if expires_in_days else None,
        team_id=team,
    )
    for field in (clear or "").split(","):
        if field.strip():
            data[field.strip()] = None
    changes = _checked(key_changes, data)

    async def work(hub: StateHub) -> Any:
        return await hub.keys.update(key_id, changes)

    record = _with_state(config, work)
    if record is None:
        typer.echo(f"no key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"updated {key_id}")


@keys_cli.command("rotate")
def keys_rotate(
    config: ConfigOption,
    key_id: Annotated[str, typer.Argument()],
    grace_seconds: Annotated[float, typer.Option(help="how long the old key still works")] = 0,
) -> None:
    """A new value for a key (same id, limits and spend); printed once."""

    async def work(hub: StateHub) -> Any:
        return await hub.keys.rotate(key_id, grace_seconds)

    rotated = _with_state(config, work)
    if rotated is None:
        typer.echo(f"no usable key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"id:  {key_id}\nkey: {rotated[0]}\n(store it now: it is not shown again)")


teams_cli = typer.Typer(no_args_is_help=True, help="Teams: keys sharing a budget and limits.")
cli.add_typer(teams_cli, name="teams")


@teams_cli.command("create")
def teams_create(
    config: ConfigOption,
    name: Annotated[str, typer.Option(help="the team's name")],
    rpm: Annotated[int | None, typer.Option(help="requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="tokens per minute")] = None,
    max_parallel: Annotated[int | None, typer.Option(help="parallel requests")] = None,
    budget: Annotated[float | None, typer.Option(help="dollars per budget period")] = None,
    budget_period: Annotated[str, typer.Option(help="day, month or total")] = "month",
) -> None:
    """Create a team; add keys to it with `keys create --team` or `keys update --team`."""
    from ballast.api.key_fields import team_options

    data = _key_data(
        name=name,
        rpm=rpm,
        tpm=tpm,
        max_parallel=max_parallel,
        budget=budget,
        budget_period=budget_period,
    )
    options = _checked(team_options, data)

    async def work(hub: StateHub) -> Any:
        return await hub.teams.create(**options)

    typer.echo(f"id: {_with_state(config, work).id}")


@teams_cli.command("list")
def teams_list(config: ConfigOption) -> None:
    """List teams with their limits, keys and spend this period."""
    from ballast.state.spend import period_of

    async def work(hub: StateHub) -> Any:
        rows = []
        for team in await hub.teams.list():
            period = period_of(team.budget_period, hub.clock.time())
            spent = await hub.teams.spend(team.id, period)
            rows.append((team, period, spent, await hub.teams.keys(team.id)))
        return rows

    for team, period, spent, keys in _with_state(config, work):
        typer.echo(
            f"{team.id}  {team.name}  rpm={team.rpm} tpm={team.tpm} parallel={team.max_parallel}"
            f" budget={team.budget}  spend({period})={spent:.6f}  keys={','.join(keys) or '-'}"
        )


@keys_cli.command("revoke")
def keys_revoke(config: ConfigOption, key_id: Annotated[str, typer.Argument()]) -> None:
    """Revoke a key by id."""

    async def work(hub: StateHub) -> Any:
        return await hub.keys.revoke(key_id)

    if not _with_state(config, work):
        typer.echo(f"no key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()

"""`ballast db`, `ballast keys` and `ballast teams`: the database's migrations, virtual keys
and teams, administered from the command line against the configured database (registered
by :mod:`ballast.cli`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ballast.cli.common import load_or_exit
from ballast.resilience.clock import SYSTEM_CLOCK

if TYPE_CHECKING:
    from ballast.config import Settings
    from ballast.state.hub import StateHub

T = TypeVar("T")

db_cli = typer.Typer(no_args_is_help=True, help="The database: migrations.")
keys_cli = typer.Typer(no_args_is_help=True, help="Virtual API keys.")
teams_cli = typer.Typer(no_args_is_help=True, help="Teams: keys sharing a budget and limits.")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="YAML config file")]


def _with_state(config: Path | Settings, work: Callable[[StateHub], Awaitable[T]]) -> T:
    """Run `work(hub)` against the configured database, migrated first."""
    import asyncio

    from ballast.state.hub import StateHub

    settings = load_or_exit(config) if isinstance(config, Path) else config

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


async def _audit(
    hub: StateHub, action: str, target: str, detail: dict[str, Any] | None = None
) -> None:
    """A change made from the command line, in the audit log the admin API writes to (who:
    `cli`, as the command runs with the database's own credentials, not an admin secret)."""
    await hub.audit.append(hub.clock.time(), "cli", action, target, detail or {})


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
    mcp: Annotated[
        str | None, typer.Option(help="comma-separated MCP servers or server/tool entries")
    ] = None,
) -> None:
    """Create a key; it is printed once and stored only as a hash."""
    from ballast.api.key_fields import key_options
    from ballast.pipeline.errors import ApiError

    data = {
        "name": name,
        "models": _listed(models),
        "rpm": rpm,
        "tpm": tpm,
        "max_parallel": max_parallel,
        "budget": budget,
        "budget_period": budget_period,
        "expires_at": SYSTEM_CLOCK.time() + expires_in_days * 86400 if expires_in_days else None,
        "max_concurrent_jobs": max_jobs,
        "team_id": team,
        "mcp": _listed(mcp),
    }
    settings = load_or_exit(config)
    try:
        options = key_options(data, settings.serves)
    except ApiError as error:
        typer.echo(error.message, err=True)
        raise typer.Exit(2) from None

    async def work(hub: StateHub) -> Any:
        made = await hub.keys.create(**options)
        await _audit(hub, "key.create", made[1].id, options)
        return made

    plaintext, record = _with_state(settings, work)
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


def _listed(text: str | None) -> list[str] | None:
    """A comma-separated option as a list; None when not given."""
    return [m.strip() for m in text.split(",") if m.strip()] if text else None


def _key_data(**given: Any) -> dict[str, Any]:
    """The options given on the command line, as the admin API takes them."""
    data = {k: v for k, v in given.items() if v is not None}
    for field in ("models", "mcp"):
        if field in data:
            data[field] = _listed(data[field])
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
    mcp: Annotated[
        str | None, typer.Option(help="comma-separated MCP servers or server/tool entries")
    ] = None,
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
        mcp=mcp,
    )
    for field in (clear or "").split(","):
        if field.strip():
            data[field.strip()] = None
    settings = load_or_exit(config)
    changes = _checked(lambda given: key_changes(given, serves=settings.serves), data)

    async def work(hub: StateHub) -> Any:
        record = await hub.keys.update(key_id, changes)
        if record is not None:
            await _audit(hub, "key.update", key_id, changes)
        return record

    record = _with_state(settings, work)
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
        rotated = await hub.keys.rotate(key_id, grace_seconds)
        if rotated is not None:
            await _audit(hub, "key.rotate", key_id, {"grace_seconds": grace_seconds})
        return rotated

    rotated = _with_state(config, work)
    if rotated is None:
        typer.echo(f"no usable key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"id:  {key_id}\nkey: {rotated[0]}\n(store it now: it is not shown again)")


@keys_cli.command("revoke")
def keys_revoke(config: ConfigOption, key_id: Annotated[str, typer.Argument()]) -> None:
    """Revoke a key by id."""

    async def work(hub: StateHub) -> Any:
        revoked = await hub.keys.revoke(key_id)
        if revoked:
            await _audit(hub, "key.revoke", key_id)
        return revoked

    if not _with_state(config, work):
        typer.echo(f"no key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


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
        team = await hub.teams.create(**options)
        await _audit(hub, "team.create", team.id, options)
        return team

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

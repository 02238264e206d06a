"""What the commands share: the config file, loaded, or every error printed and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from ballast.config import ConfigError, load_settings

if TYPE_CHECKING:
    from ballast.config import Settings


def load_or_exit(config: Path) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as exc:
        _exit(exc.errors)


def runnable_or_exit(config: Path) -> Settings:
    """The config, loaded, and every optional extra it needs installed: what `serve` will
    need, checked before it says it is serving (and by `check-config`)."""
    from ballast.config.extras import missing_extras
    from ballast.observe.tracing import tracing_source

    settings = load_or_exit(config)
    problems = missing_extras(settings, tracing_source(settings.observe.tracing))
    if problems:
        _exit(problems)
    return settings


def _exit(lines: list[str]) -> NoReturn:
    for line in lines:
        typer.echo(line, err=True)
    raise typer.Exit(2) from None

"""What the commands share: the config file, loaded, or every error printed and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ballast.config import ConfigError, load_settings

if TYPE_CHECKING:
    from ballast.config import Settings


def load_or_exit(config: Path) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as exc:
        for line in exc.errors:
            typer.echo(line, err=True)
        raise typer.Exit(2) from None

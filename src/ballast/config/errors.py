"""The one error a config can fail with, whatever the concern that found the problem."""

from __future__ import annotations


class ConfigError(Exception):
    """A config that cannot be used; `errors` holds one `path: message` line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors

"""The base of every settings section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Settings validated once at start-up: an unknown key is an error (a typo must not
    pass as a default), and the values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

"""The clocks of a request and a stream, globally and as one deployment's overrides."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section


class Timeouts(Section):
    """Seconds. `first_token` and `inter_chunk` are the two stream clocks: a stream can hang
    without failing, so both its first token and every gap after it are timed."""

    connect: float = Field(5.0, gt=0)
    pool: float = Field(2.0, gt=0, description="waiting for a free pooled connection")
    first_token: float = Field(30.0, gt=0)
    inter_chunk: float = Field(30.0, gt=0)
    answer: float = Field(300.0, gt=0, description="one deployment's whole non-streamed answer")
    request: float = Field(600.0, gt=0, description="a client request, all attempts included")


class TimeoutOverrides(Section):
    connect: float | None = Field(None, gt=0)
    pool: float | None = Field(None, gt=0)
    first_token: float | None = Field(None, gt=0)
    inter_chunk: float | None = Field(None, gt=0)
    answer: float | None = Field(None, gt=0)
    request: float | None = Field(None, gt=0)

    def apply(self, base: Timeouts) -> Timeouts:
        overrides = {k: v for k, v in self.model_dump().items() if v is not None}
        return base.model_copy(update=overrides) if overrides else base

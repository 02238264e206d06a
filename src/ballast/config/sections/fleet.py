"""How admin actions reach every worker and instance (`fleet:`)."""

from __future__ import annotations

from pydantic import Field

from ballast.config.base import Section


class FleetSettings(Section):
    """How admin actions (drain, enable, reload, key changes) reach every worker and
    instance: at once over local sockets and Redis pub/sub; by polling the database's
    command log as the fallback."""

    fallback_poll: float = Field(
        0.25,
        gt=0,
        description="command log polling while Redis is down or not configured (an action"
        " then takes up to this, plus its own time, to reach another instance)",
    )
    safety_poll: float = Field(
        5.0, gt=0, description="command log polling while Redis pub/sub carries commands"
    )
    heartbeat: float = Field(
        1.0, gt=0, description="each worker's summary written to Redis for the fleet view"
    )
    peer_timeout: float = Field(0.5, gt=0, description="asking another worker of this instance")
    resubscribe: float = Field(
        1.0, gt=0, description="pause before a lost Redis subscription is made again"
    )
    share_health: bool = Field(
        True,
        description="tell every worker of every instance, through Redis, of a deployment's"
        " failures, open breaker, cooldown and recovery (`routing.breaker.probe_timeout` is"
        " how long past an open period the others wait for the first worker's probe)",
    )

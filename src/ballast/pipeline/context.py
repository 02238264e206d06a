"""What the stages of one request share, carried from parse to settle."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ballast.config import ModelGroup
from ballast.state.budgets import Hold
from ballast.state.keys import KeyRecord
from ballast.state.ratelimit import Lease
from ballast.stream.usage import Usage

if TYPE_CHECKING:
    from ballast.cache.service import Lookup
    from ballast.routing.attempt_loop import Attempts


_PARAM = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def param_name(name: str) -> str:
    """A client's parameter name fit for a header, a log field and a metric label: as it is
    when it is a plain name, else `other` (a client may send any key it likes)."""
    return name if _PARAM.fullmatch(name) else "other"


@dataclass(slots=True)
class Ticket:
    """One admitted request: the key it runs under and what it holds."""

    key: KeyRecord
    lease: Lease | None
    estimated_tokens: int
    holds: tuple[Hold, ...] = ()  # its worst-case cost, reserved against each budget
    team_lease: Lease | None = None  # the team's limits, when the key is in one


@dataclass(slots=True)
class RequestContext:
    """One client request. `payload` is the body as parsed and never changed in place;
    every outgoing change is an entry in `edits` (None removes a key), applied once, when a
    deployment's body is made. The client's bytes go out as they came when nothing changes."""

    path: str  # the upstream API: "/chat/completions", "/completions" or "/embeddings"
    payload: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    request_id: str | None = None
    shape: str = "openai"  # the inbound API shape the client spoke (logs and metrics)
    fallbacks: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] | None = None  # the key's models, set by admit
    authorization: bytes | None = None  # the client's Authorization header, as sent
    edits: dict[str, Any] = field(default_factory=dict)
    # Parameters translation had to leave out (the x-ballast-dropped header, logs, metrics).
    dropped: tuple[str, ...] = ()
    # Request headers a native upstream of the client's own shape reads, as the client sent.
    forwarded: tuple[tuple[str, str], ...] = ()
    # The request answered in the client's own shape by the upstream (a native pass-through).
    native: bool = False
    # The request's other form, for the deployments of its chain that do not take this one:
    # a native request's chat form; an extended chat form's plain one.
    bridge: RequestContext | None = None
    # A chat form with more than OpenAI's chat (a bridged Messages request's cache marks and
    # thinking): only the providers that carry it take it (providers/base.Adapter.takes).
    extended: bool = False
    group: ModelGroup | None = None  # set by resolve
    ticket: Ticket | None = None  # set by admit, when keys are in use
    lookup: Lookup | None = None  # set by the cache stage, for groups with a cache
    attempts: Attempts | None = None  # set by dispatch (logs and metrics read it)
    usage_added: bool = False  # usage was asked of the upstream for accounting only
    settled: bool = False  # usage and spend recorded (or the request ended without them)
    # What answered, for the request log and metrics (set at settle).
    usage: Any = None  # the usage the upstream reported
    tokens: Usage | None = None  # that usage, read (prompt and completion first)
    usage_estimated: bool = False  # Ballast's estimate (a stream cut short), not reported
    answered_model: str | None = None  # the model name in the answer
    finish_reason: str | None = None  # the answer's first choice's
    upstream_headers: Any = None  # the answering upstream's headers (its request id)
    _credential: str | None = None

    @property
    def credential(self) -> str:
        """Who is asking, as a stable, non-reversible id (never the key itself): remote
        resources are kept per credential. Hashed only for the requests that need it."""
        if self._credential is None:
            given = self.authorization
            self._credential = hashlib.sha256(given).hexdigest()[:24] if given else "anonymous"
        return self._credential

    def outgoing(self, key: str) -> Any:
        """A body field as it will be sent: the edited value where there is one."""
        return self.edits[key] if key in self.edits else self.payload.get(key)

    def ask_for_usage(self) -> bool:
        """Streams must report usage for accounting. When the client did not ask for it, ask
        the upstream anyway and return True: the relay then keeps the usage chunk from the
        client. Idempotent."""
        if self.usage_added:
            return True
        options = self.outgoing("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            return False
        self.edits["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        self.usage_added = True
        return True

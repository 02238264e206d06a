"""The provider interface: what the attempt loop and the relay ask of an upstream protocol.

An adapter turns the pipeline's request into the bytes one deployment is sent, says what the
provider can do (go on from a prefill, hand out per-run endpoints), and routes a call through
whatever the provider needs around it (a run handle, an access token). It owns no policy:
retries, breakers and deadlines stay with routing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import orjson

from ballast.config import Deployment
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.handles import HandleCache, SharedSource
from ballast.upstream.client import Route, Upstream
from ballast.upstream.provider_wire import Wire

T = TypeVar("T")

_UNSET = object()


@dataclass(frozen=True, slots=True)
class Capabilities:
    prefill: bool = False  # continues an assistant message it is given (continuation)


def thinking_on(payload: dict[str, Any]) -> bool:
    """Whether a chat request turns the model's reasoning on: Anthropic's `thinking` (also
    what DeepSeek, GLM and Kimi servers read), a chat template's `enable_thinking` (vLLM,
    SGLang, llama.cpp) or `reasoning_effort`. Such a model refuses an assistant prefill (400)
    or thinks afresh after it, so a continuation regenerates instead."""
    thinking = payload.get("thinking")
    if thinking is True or (
        isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled")
    ):
        return True
    template = payload.get("chat_template_kwargs")
    if isinstance(template, dict) and (template.get("enable_thinking") or template.get("thinking")):
        return True
    effort = payload.get("reasoning_effort")
    return isinstance(effort, str) and effort != "none"


class OutboundCall(Protocol):
    """What an adapter reads of a client request (the pipeline's request context)."""

    @property
    def path(self) -> str: ...  # "/chat/completions", "/completions" or "/embeddings"
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def raw(self) -> bytes: ...  # the client's body as it came
    @property
    def model(self) -> str: ...
    @property
    def edits(self) -> dict[str, Any]: ...  # outgoing changes; a value of None removes a key
    @property
    def credential(self) -> str: ...
    @property
    def request_id(self) -> str | None: ...  # passed on to the deployment
    # The client's headers a native upstream reads; the chat form of a call for a deployment
    # that does not speak the call's own shape.
    @property
    def forwarded(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def bridge(self) -> OutboundCall | None: ...
    # A chat form that carries more than OpenAI's chat: what a bridged Messages request
    # asked of Anthropic (`cache_control` marks, `thinking`, earlier turns' `thinking_blocks`).
    # A provider that carries none of it takes the call's `bridge`, the plain chat form.
    @property
    def extended(self) -> bool: ...


class EditedCall:
    """A call sent with other edits than its own (asked for as a stream, a field a provider
    refuses left out); everything else is the client's request as it came."""

    __slots__ = ("_call", "edits")

    def __init__(self, call: OutboundCall, edits: dict[str, Any]) -> None:
        self._call = call
        self.edits = edits

    @property
    def path(self) -> str:
        return self._call.path

    @property
    def payload(self) -> dict[str, Any]:
        return self._call.payload

    @property
    def raw(self) -> bytes:
        return self._call.raw

    @property
    def model(self) -> str:
        return self._call.model

    @property
    def credential(self) -> str:
        return self._call.credential

    @property
    def request_id(self) -> str | None:
        return self._call.request_id

    @property
    def forwarded(self) -> tuple[tuple[str, str], ...]:
        return self._call.forwarded

    @property
    def bridge(self) -> OutboundCall | None:
        """The other form of the call, with the same edits (a call and its bridge share
        theirs, so what this call changes applies to its bridge too)."""
        bridge = self._call.bridge
        return None if bridge is None else EditedCall(bridge, self.edits)

    @property
    def extended(self) -> bool:
        return self._call.extended


class SessionSource(Protocol):
    """A durable (credential, model) -> session id map, for providers with sessions."""

    async def get_or_create(self, credential: str, model: str, new: Callable[[], str]) -> str: ...


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What an adapter may use from the layers that build it (all optional)."""

    clock: Clock = SYSTEM_CLOCK
    handle_refresh_margin: float = 60.0
    sessions: SessionSource | None = None
    shared_handles: SharedSource | None = None
    on_event: Callable[[str, dict[str, Any]], None] | None = None  # what the gateway shows


class Adapter:
    """The OpenAI wire, unchanged: the base every OpenAI-compatible provider starts from."""

    name: ClassVar[str] = "openai"
    # What this provider's requests carry of an extended chat form (OutboundCall.extended):
    # "cache_control" (prompt cache marks), "thinking" (the budget and earlier turns'
    # signed thinking). An OpenAI-compatible wire carries none: it takes the plain form.
    extensions: ClassVar[frozenset[str]] = frozenset()
    # Remote resource handles (per-run endpoints and tokens), for providers that use them.
    handles: HandleCache | None = None

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        self.deployment = deployment
        self.upstream = upstream
        self.context = context
        # Unset: the provider's default, which for OpenAI-compatible upstreams is no.
        self.capabilities = Capabilities(prefill=deployment.supports_prefill is True)

    async def start(self) -> None:
        """Prepare anything the provider needs before the first request."""

    async def close(self) -> None:
        """Release what `start` and the requests made."""

    def speaks(self, path: str) -> bool:
        """Whether a call on `path` goes to this deployment as it is; False: it is sent in
        its chat form (a Messages request to a deployment that does not speak Messages)."""
        return path != "/messages"

    def takes(self, call: OutboundCall) -> bool:
        """Whether `call` goes to this deployment in its own form; False: in its bridge's
        (a Messages request to a deployment that does not speak Messages; an extended chat
        form to one that carries none of its extensions)."""
        return self.speaks(call.path) and (bool(self.extensions) or not call.extended)

    def upstream_model(self, model: str) -> str:
        """The name the deployment knows the model by: its configured one, or the client's."""
        configured = self.deployment.model
        return model if configured is None or configured == "*" else configured

    def body(self, call: OutboundCall, model: str, prefill: str | None = None) -> bytes:
        """The request body for this deployment. The client's own bytes go out untouched
        when nothing changes; otherwise the body is encoded once, with every edit applied.
        `prefill`: text the answer must go on from (a continuation), sent only where the
        deployment `continues` it."""
        if prefill is not None and not self.continues(call, prefill):
            prefill = None
        upstream_model = self.upstream_model(model)
        if prefill is None and upstream_model == call.model:
            if not call.edits:
                return call.raw
            spliced = _added(call.raw, call.payload, call.edits)
            if spliced is not None:
                return spliced
        payload = edited(call)
        payload["model"] = upstream_model
        if prefill is not None:
            self.apply_prefill(call, payload, prefill)
        return orjson.dumps(payload)

    def wire(
        self,
        call: OutboundCall,
        model: str,
        body: bytes,
        stream: bool,
        prefill: str | None = None,
    ) -> Wire | None:
        """How this call is spoken when the provider's format is not OpenAI's: its path,
        headers (computed from the final `body` where a signature needs it), and the
        translation of its answer, stream and errors. None: the OpenAI wire, untouched."""
        return None

    def count_wire(self, call: OutboundCall) -> Wire | None:
        """The wire of the provider's own token count for a Messages `call` (its body is
        `body(call, model)`); None: the provider has none, and the gateway estimates."""
        return None

    def apply_prefill(self, call: OutboundCall, payload: dict[str, Any], text: str) -> None:
        """Ask the deployment to go on from `text` (only where it `continues`): a text
        completion's prompt simply grows; a chat gets the text as a final assistant message."""
        if call.path == "/completions":
            payload["prompt"] = payload["prompt"] + text
        else:
            payload["messages"] = [*payload["messages"], {"role": "assistant", "content": text}]

    def continues(self, call: OutboundCall, prefill: str) -> bool:
        """The one decision whether this deployment is sent `prefill` and goes on from it,
        so its answer holds only the rest; False: it is sent the request as it is and the
        answer is regenerated and checked against what the client has. A chat is continued
        only by a deployment that can (`supports_prefill`), never with reasoning on."""
        payload = edited(call) if call.edits else call.payload
        if call.path == "/completions":
            return isinstance(payload.get("prompt"), str)
        return (
            call.path == "/chat/completions"
            and self.capabilities.prefill
            and bool(prefill)
            and isinstance(payload.get("messages"), list)
            and not thinking_on(payload)
        )

    def routed(
        self, call: OutboundCall, model: str, send: Callable[[Route | None], Awaitable[T]]
    ) -> Awaitable[T]:
        """Run `send` with the route this call takes: None, the deployment's own URL and key."""
        return send(None)

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire | None:
        """The header lines the probe `probe_request` named goes with, for a provider with
        its own credential header (or a signature over the exact `body`); None: the
        deployment's bearer token."""
        return None

    def probe_request(self) -> tuple[str, str, dict[str, Any] | None] | None:
        """(method, path, body) of the background probe of an open deployment, or None when
        it is not probed. A one-token completion needs the model's name; without one the
        model list stands in (it can answer while completions fail, so it proves less)."""
        kind = self.deployment.probe
        if kind == "none":
            return None
        model = self.deployment.model
        if kind in ("completion", "auto") and model is not None and model != "*":
            body = {"model": model, "messages": [{"role": "user", "content": "ping"}]}
            return "POST", "/chat/completions", {**body, "max_tokens": 1}
        return "GET", "/models", None


def edited(call: OutboundCall) -> dict[str, Any]:
    """A copy of the client's payload with the call's edits applied (a value of None
    removes its key): the one place edits are applied, whatever the provider's format."""
    payload = dict(call.payload)
    for key, value in call.edits.items():
        if value is None:
            payload.pop(key, None)
        else:
            payload[key] = value
    return payload


def _added(raw: bytes, payload: dict[str, Any], edits: dict[str, Any]) -> bytes | None:
    """The client's bytes with fields added in front, when the edits only add fields the
    body does not have: cheaper than encoding the whole body again (a whole answer asked
    for as a stream adds two). None when the body must be encoded."""
    body = raw.lstrip()
    if not body.startswith(b"{"):
        return None
    for key, value in edits.items():
        if value is None or key in payload:
            return None
    added = orjson.dumps(edits)  # '{"a":1,"b":2}': its inside goes before the client's fields
    rest = body[1:].lstrip()
    joiner = b"" if rest.startswith(b"}") else b","
    return added[:-1] + joiner + rest

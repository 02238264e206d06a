"""AWS Bedrock through Converse and ConverseStream, signed with SigV4.

Credentials come from botocore's standard chain (environment, shared profile, container or
instance role). Resolving and refreshing them can mean network calls, so both run in a worker
thread: at start, and again in the background when botocore says they are due, while
requests go on signing with the current ones (still valid until their expiry). The signature
covers the final body bytes, so it is made per call when the Wire is built. botocore is
imported only when a Bedrock deployment starts."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar
from urllib.parse import quote

import ballast.providers.bedrock_answer as bedrock_answer
from ballast.config import AwsSettings, Deployment
from ballast.providers.base import AdapterContext, OutboundCall
from ballast.providers.bedrock_answer import ConverseStream
from ballast.providers.bedrock_request import converse_body
from ballast.providers.native import (
    ChatWire,
    Deferred,
    Ids,
    NativeAdapter,
    closing,
    event,
    include_usage,
)
from ballast.resilience import failures
from ballast.resilience.failures import Failure
from ballast.upstream.client import Upstream
from ballast.upstream.eventstream import EventStreamDecoder, EventStreamError
from ballast.upstream.provider_wire import Decoder, Wire
from ballast.upstream.sse import MAX_EVENT_BYTES

log = logging.getLogger("ballast.providers.bedrock")

STREAM_TYPE = "application/vnd.amazon.eventstream"
REFRESH_AHEAD = 300.0  # seconds before expiry a background refresh starts
_SIGNED = ("authorization", "x-amz-date", "x-amz-security-token")


class BedrockDecoder:
    """Event-stream frames of ConverseStream, as chat SSE events."""

    __slots__ = ("_frames", "_held", "_stream", "_usage")

    def __init__(
        self, ids: Ids, usage: bool, trim: bool = False, max_event_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self._frames = EventStreamDecoder(max_event_bytes)
        self._stream = ConverseStream(ids, trim)
        self._usage = usage
        self._held = Deferred()

    def feed(self, data: bytes) -> list[bytes]:
        return self._held.run(lambda out: self._decode(data, out))

    def _decode(self, data: bytes, out: list[bytes]) -> None:
        try:
            frames = self._frames.feed(data)
        except EventStreamError as exc:
            raise Failure(failures.BAD_RESPONSE, str(exc)) from None
        for frame in frames:
            out += [event(chunk) for chunk in self._stream.feed(frame)]

    def finish(self) -> list[bytes]:
        def rest(out: list[bytes]) -> None:
            self._decode(b"", out)  # a bad frame held back behind good ones is raised now
            if not self._frames.pending:  # ended inside a frame: a cut, nothing owed
                out += closing(self._stream.finished, self._stream.end(self._usage))

        return self._held.run(rest)


class BedrockWire(ChatWire):
    __slots__ = ("trim",)
    stream_type = STREAM_TYPE
    trim: bool  # the prefill went without its trailing whitespace

    def decoder(self, max_event_bytes: int = MAX_EVENT_BYTES) -> Decoder:
        return BedrockDecoder(self._ids, self._usage, self.trim, max_event_bytes)


def _parse_error(
    status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...], retry_after: float | None
) -> Failure:
    return bedrock_answer.parse_error(status, body, headers, retry_after)


class BedrockAdapter(NativeAdapter):
    name: ClassVar[str] = "bedrock"
    extensions: ClassVar[frozenset[str]] = frozenset(("cache_control",))  # as cachePoint

    def __init__(self, deployment: Deployment, upstream: Upstream, context: AdapterContext):
        super().__init__(deployment, upstream, context)
        self._aws = deployment.aws or AwsSettings()
        self._credentials: Any = None  # botocore Credentials, resolved in start()
        self._frozen: Any = None  # the ReadOnlyCredentials requests are signed with
        self._refresh: asyncio.Task[None] | None = None
        self._signer: Any = None
        self._request: Any = None

    async def start(self) -> None:
        from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
        from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]

        self._signer, self._request = SigV4Auth, AWSRequest
        try:
            await self._resolve()
        except Exception as exc:  # requests will fail over until credentials can be had
            log.warning("deployment %s: no AWS credentials yet (%s)", self.upstream.id, exc)

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()

    async def _resolve(self) -> None:
        self._credentials, self._frozen = await asyncio.to_thread(self._chain)

    def _chain(self) -> tuple[Any, Any]:
        import botocore.session  # type: ignore[import-untyped]

        credentials = self._credentials
        if credentials is None:
            session = botocore.session.Session(profile=self._aws.profile)
            credentials = session.get_credentials()
            if credentials is None:
                raise LookupError("the AWS credential chain found none")
        return credentials, credentials.get_frozen_credentials()

    def translate(self, payload: dict[str, Any], model: str) -> dict[str, Any]:
        return converse_body(payload)

    def probe_path(self, model: str) -> str:
        return f"/model/{quote(self.upstream_model(model), safe='')}/converse"

    def probe_body(self) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": [{"text": "ping"}]}],
                "inferenceConfig": {"maxTokens": 1}}  # fmt: skip

    def probe_wire(self, method: str, path: str, body: bytes | None) -> Wire:
        """Signed over the probe's own bytes."""
        return Wire("", self._sign(path, body or b""))

    def apply_prefill(self, call: OutboundCall, payload: dict[str, Any], text: str) -> None:
        """A final assistant turn to go on from (Claude on Bedrock continues one), without
        its trailing whitespace, which Converse refuses there."""
        payload["messages"] = [
            *payload["messages"],
            {"role": "assistant", "content": text.rstrip()},
        ]

    def continues(self, call: OutboundCall, prefill: str) -> bool:
        """As any chat deployment, and never a prefill that is only white space."""
        return bool(prefill.rstrip()) and super().continues(call, prefill)

    def wire(
        self,
        call: OutboundCall,
        model: str,
        body: bytes,
        stream: bool,
        prefill: str | None = None,
    ) -> BedrockWire:
        name = quote(self.upstream_model(model), safe="")
        target = f"/model/{name}/converse-stream" if stream else f"/model/{name}/converse"
        wire = BedrockWire(
            target,
            self._sign(target, body),
            self.ids(model),
            include_usage(call),
            bedrock_answer.whole,
            _parse_error,
        )
        trimmed = prefill is not None and prefill != prefill.rstrip()
        wire.trim = trimmed and self.continues(call, prefill or "")
        return wire

    def _sign(self, target: str, body: bytes) -> bytes:
        """The SigV4 header lines for this exact request."""
        self._refresh_if_due()
        if self._frozen is None or self._signer is None:
            raise Failure(failures.UPSTREAM_AUTH, "no AWS credentials", deployment=self.upstream.id)
        request = self._request(
            "POST",
            self.upstream.base_url + target,
            data=body,
            headers={"content-type": "application/json"},
        )
        self._signer(self._frozen, self._aws.service, self._aws.region).add_auth(request)
        lines = [
            f"{name}: {request.headers[name]}\r\n" for name in _SIGNED if name in request.headers
        ]
        return "".join(lines).encode("latin-1")

    def _refresh_if_due(self) -> None:
        """Start one background refresh when the credentials near expiry (or are missing)."""
        credentials = self._credentials
        due = credentials is None or (
            hasattr(credentials, "refresh_needed") and credentials.refresh_needed(REFRESH_AHEAD)
        )
        if not due or (self._refresh is not None and not self._refresh.done()):
            return
        self._refresh = asyncio.get_running_loop().create_task(self._background_refresh())

    async def _background_refresh(self) -> None:
        try:
            await self._resolve()
        except Exception as exc:
            log.warning("deployment %s: AWS credentials refresh failed (%s)", self.upstream.id, exc)

"""The wire to one MCP server: Streamable HTTP POSTs on Ballast's pooled HTTP/1.1 client,
with the server's own credential (never the client's), and its answer read whole, as one
JSON object or from an SSE stream (the first message that answers our request).

What an answer means (a lost session, a tool's error) is the session's; here a failure to
get one is a `Failure` of the one taxonomy (connect, reset, bad answer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ballast.config import McpServerSettings
from ballast.resilience import failures
from ballast.resilience.clock import SYSTEM_CLOCK, Clock
from ballast.resilience.failures import Failure
from ballast.upstream import http1
from ballast.upstream.client import USER_AGENT
from ballast.upstream.http1 import Pool, Response, default_tls_context, header_lines, split_url
from ballast.upstream.sse import EventTooLarge, SseSplitter, event_data


@dataclass(slots=True)
class Reply:
    """A server's answer to one POST: its status, the session id it named, and the JSON-RPC
    message that answers the request (None for a 202 or an answer without one)."""

    status: int
    session: str | None
    message: dict[str, Any] | None


class Link:
    """One server's bounded connection pool and the fixed lines of every request to it."""

    def __init__(
        self,
        settings: McpServerSettings,
        keepalive: float,
        max_answer: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = settings.name
        self._settings = settings
        self._keepalive = keepalive
        self._max_answer = max_answer
        self._clock = clock
        self._origin, self._target = split_url(settings.url)
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "accept-encoding": "identity",
            "user-agent": USER_AGENT,
        }
        # The server's credential, as configured; a configured name replaces ours.
        headers.update({k.lower(): v.get_secret_value() for k, v in settings.headers.items()})
        self._fixed = self._origin.host_header + header_lines(headers)
        self._pool: Pool | None = None

    async def start(self) -> None:
        self._pool = Pool(
            limit=self._settings.pool_size,
            keepalive=self._keepalive,
            connect_timeout=self._settings.connect_timeout,
            pool_timeout=self._settings.connect_timeout,
            clock=self._clock,
        )
        if self._origin.tls:
            default_tls_context()  # load the trust store now, not on a request

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def post(self, body: bytes, extra: bytes, id_: Any) -> Reply:
        """POST one message (`extra`: its own header lines, e.g. the session id) and read the
        answer to request `id_` (None for a notification)."""
        head = b"".join(
            (
                b"POST ",
                self._target,
                b" HTTP/1.1\r\n",
                self._fixed,
                extra,
                b"content-length: %d\r\n\r\n" % len(body),
            )
        )
        response = await self._send(head, body)
        try:
            return await self._read(response, id_)
        except http1.TooLarge:
            raise Failure(failures.BAD_RESPONSE, "answer too large", deployment=self.name) from None
        except http1.HttpError:
            raise Failure(failures.RESET, "connection reset", deployment=self.name) from None
        finally:
            response.release()

    async def delete(self, extra: bytes) -> None:
        """End a session on the server (DELETE); a 405 or any failure is the server's."""
        head = b"".join((b"DELETE ", self._target, b" HTTP/1.1\r\n", self._fixed, extra, b"\r\n"))
        response = await self._send(head, b"")
        try:
            await response.read(max_size=self._max_answer)
        finally:
            response.release()

    async def _send(self, head: bytes, body: bytes) -> Response:
        pool = self._pool
        if pool is None:
            raise Failure(failures.CONNECT, "server is not started", deployment=self.name)
        try:
            return await pool.request(self._origin, head, body)
        except (http1.ConnectTimeout, http1.ConnectFailed) as exc:
            raise Failure(failures.CONNECT, str(exc), deployment=self.name) from None
        except http1.PoolTimeout:
            raise Failure(
                failures.POOL_TIMEOUT, "no free connection", deployment=self.name
            ) from None
        except http1.BadResponse:
            raise Failure(failures.BAD_RESPONSE, "malformed answer", deployment=self.name) from None
        except http1.HttpError:
            raise Failure(failures.RESET, "connection reset", deployment=self.name) from None

    async def _read(self, response: Response, id_: Any) -> Reply:
        session = response.headers.get("mcp-session-id")
        kind = response.headers.get("content-type") or ""
        if "text/event-stream" in kind:
            message = await self._from_stream(response, id_)
        else:
            raw = await response.read(max_size=self._max_answer)
            message = _message(raw, id_) if raw and response.status != 202 else None
        return Reply(response.status, session, message)

    async def _from_stream(self, response: Response, id_: Any) -> dict[str, Any] | None:
        """The message answering `id_` in an SSE stream; notifications before it (progress,
        logs) are not relayed. The stream is left once the answer came."""
        splitter = SseSplitter(self._max_answer)
        try:
            while True:
                data = await response.readany()
                if not data:
                    events = splitter.finish()
                else:
                    events = splitter.feed(data)
                for event in events:
                    payload = event_data(event)
                    message = _message(payload, id_) if payload else None
                    if message is not None:
                        return message
                if not data:
                    return None
        except EventTooLarge:
            raise Failure(failures.BAD_RESPONSE, "event too large", deployment=self.name) from None


def _message(raw: bytes, id_: Any) -> dict[str, Any] | None:
    """`raw` as the JSON-RPC answer to `id_`, else None."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and data.get("id") == id_ and ("result" in data or "error" in data):
        return data
    return None

"""A whole answer from one deployment (`fetch`, its `Reply`), and the head every answer
starts with (`answer_head`: the status and headers, read within the first-token clock). An
upstream's refusal leaves here as a classified Failure with the start of its body."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ballast.resilience import failures
from ballast.resilience.clock import Clock
from ballast.resilience.deadline import Deadline, Watchdog
from ballast.resilience.failures import Failure
from ballast.resilience.retry import parse_retry_after
from ballast.upstream.client import Upstream, UpstreamRequest, relay_headers
from ballast.upstream.http1 import HttpError, Response, TooLarge
from ballast.upstream.provider_wire import Wire

MAX_ERROR_BODY = 64 * 1024


@dataclass(slots=True)
class Reply:
    """A complete upstream answer."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    payload: object  # the parsed body of a 2xx answer (usage, model)


def _retry_after(response: Response, clock: Clock) -> float | None:
    headers = response.headers
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"), clock)


async def _failure_from(
    response: Response, upstream: Upstream, clock: Clock, wire: Wire | None
) -> Failure:
    try:
        body = await response.read(MAX_ERROR_BODY)
    except HttpError:
        body = b""
    finally:
        response.release()
    classify = failures.failure_for_status if wire is None else wire.failure
    return classify(
        response.status, body, relay_headers(response), _retry_after(response, clock), upstream.id
    )


async def fetch(upstream: Upstream, request: UpstreamRequest, clock: Clock) -> Reply:
    """A non-streaming exchange that must finish before the request's `until`; its `wire`,
    a provider's own format, else the OpenAI wire untouched."""
    now = clock.monotonic()
    budget = min(request.until - now, upstream.timeouts.answer)
    path, wire = request.path, request.wire
    if budget <= 0:
        raise Failure(failures.REQUEST_TIMEOUT, "request deadline passed", deployment=upstream.id)
    try:
        with Deadline(clock, now + budget):
            response = await upstream.post(request)
            if response.status >= 300:
                raise await _failure_from(response, upstream, clock, wire)
            try:
                data = await response.read(max_size=upstream.answer_limit(path))
            except TooLarge:
                raise too_large(upstream, path) from None
            except HttpError:
                raise Failure(
                    failures.RESET,
                    "connection lost while reading the answer",
                    deployment=upstream.id,
                ) from None
            finally:
                response.release()  # to the pool when read to its end, else dropped
    except TimeoutError:
        raise Failure(
            failures.REQUEST_TIMEOUT,
            f"no complete answer within {budget:.1f}s",
            deployment=upstream.id,
        ) from None
    return reply_of(response, data, upstream, wire)


def too_large(upstream: Upstream, path: str) -> Failure:
    """The failure of an answer past its limit (its connection is already dropped)."""
    return Failure(
        failures.BAD_RESPONSE,
        f"the upstream's answer is larger than max_response_bytes"
        f" ({upstream.answer_limit(path)} bytes)",
        deployment=upstream.id,
    )


def reply_of(response: Response, data: bytes, upstream: Upstream, wire: Wire | None) -> Reply:
    """A whole 2xx answer read to its end, in chat-completion form."""
    if wire is not None:
        try:
            data, translated = wire.answer(data)
        except ValueError:
            raise Failure(
                failures.BAD_RESPONSE, "upstream sent an unusable answer", deployment=upstream.id
            ) from None
        return Reply(response.status, relay_headers(response), data, translated)
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise Failure(
            failures.BAD_RESPONSE, "upstream sent a non-JSON answer", deployment=upstream.id
        ) from None
    if not isinstance(payload, dict):
        raise Failure(
            failures.BAD_RESPONSE, "upstream sent a non-object answer", deployment=upstream.id
        )
    return Reply(response.status, relay_headers(response), data, payload)


async def answer_head(
    upstream: Upstream, request: UpstreamRequest, clock: Clock, deadline: float
) -> tuple[Response, Watchdog]:
    """Send a request whose answer is awaited on the first-token clock, until `deadline`; a
    2xx response with the stream's one timer (a Watchdog), or the upstream's failure."""
    watchdog = Watchdog(clock)  # the stream's one timer, from the request on
    try:
        with watchdog.until(deadline):
            response = await upstream.post(request)
    except TimeoutError:
        watchdog.close()
        raise Failure(
            failures.FIRST_TOKEN_TIMEOUT,
            f"no answer within {upstream.timeouts.first_token:g}s",
            deployment=upstream.id,
        ) from None
    except BaseException:
        watchdog.close()
        raise
    if response.status >= 300:
        watchdog.close()
        raise await _failure_from(response, upstream, clock, request.wire)
    return response, watchdog

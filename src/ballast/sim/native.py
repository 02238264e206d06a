"""One fault-injecting request driver for the native provider wires (Gemini, Bedrock).

A wire module parses its own request into a NativeCall and says how its answers, stream
events and errors look; this module applies the behaviour menu the same way for each: error
answers, reset, silence, latency and slow first token, and for streams a cut, a stall, a
malformed event, a stream never properly ended (`no_done`: every event, then the connection
closes without the body's end), an in-band error event (`error_event`) and a corrupt
frame (`bad_crc`). `expired_token` answers 401
to the first bearer token it sees and to that token ever after, as a remote does once a
token has expired: a client that renews its token gets through."""

from __future__ import annotations

import math
import random
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aiohttp import web

from ballast.sim.answer import Answer, billed, chat_answer
from ballast.sim.behaviour import Behaviour
from ballast.sim.bodies import Ids
from ballast.sim.conn import close as _close
from ballast.sim.conn import pause as _pause
from ballast.sim.conn import reset as _reset
from ballast.sim.state import SIM_STATE, Rule, seen_headers

BEHAVIOUR_HEADER = "x-sim-behaviour"
ERRORS = frozenset({"429", "500", "503", "context_length", "409", "401"})
_CREDENTIALS = ("authorization", "x-goog-api-key", "x-amz-security-token")
_EXPIRED: weakref.WeakKeyDictionary[Rule, str] = weakref.WeakKeyDictionary()


class BadCall(Exception):
    """A request the wire cannot read: answered with the wire's own 400."""


@dataclass(frozen=True, slots=True)
class NativeCall:
    model: str
    messages: list[dict[str, Any]]  # chat-shaped {role, content}: what the answer is made from
    max_tokens: int | None
    stream: bool
    token: str | None  # the bearer token or key, for 401 and expired_token
    include_usage: bool = True
    # The prompt up to each of its cache marks, with the mark's time to live (prompt_cache.py).
    cache_prefixes: tuple[tuple[str, str], ...] = ()
    cache_marks: tuple[str, ...] = ()  # where the marks are, for the tests to read


class Wire(Protocol):
    stream_type: str  # content type of a stream

    def error(self, behaviour: Behaviour, answer: Answer) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and headers of an error behaviour."""
        ...

    def bad_request(self, message: str) -> tuple[int, bytes, dict[str, str]]: ...
    def whole(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> bytes: ...
    def events(self, ids: Ids, answer: Answer, behaviour: Behaviour) -> list[bytes]:
        """Every event of the stream: the opening ones, one per token, the closing ones."""
        ...

    def usage(self, answer: Answer) -> dict[str, Any]:
        """The whole answer's usage, as the provider reports it (for the log)."""
        ...

    def opening(self, behaviour: Behaviour) -> int:
        """How many events come before the first token's."""
        ...

    def closing(self, behaviour: Behaviour) -> int:
        """How many events end the stream, after the last token's."""
        ...

    def malformed(self) -> bytes: ...
    def corrupt(self, event: bytes) -> bytes: ...
    def error_event(self) -> bytes:
        """The provider's own in-band error, sent mid-stream by `error_event`."""
        ...


async def handle(
    request: web.Request, wire: Wire, call: NativeCall | BadCall
) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    headers = seen_headers(request, _CREDENTIALS, ("x-amz-date",))
    if isinstance(call, BadCall):
        state.record(
            model=None, path=request.path, behaviour=None, outcome="bad_request",
            stream=False, prefill=False, headers=headers,
        )  # fmt: skip
        return _respond(wire.bad_request(str(call)))
    try:
        rule = state.select(call.model, request.headers.get(BEHAVIOUR_HEADER))
    except ValueError as exc:
        return _respond(wire.bad_request(f"invalid {BEHAVIOUR_HEADER}: {exc}"))
    behaviour = rule.behaviour
    answer = billed(chat_answer(call.messages, behaviour.tokens, call.max_tokens), behaviour)
    outcome = _outcome(rule, call)
    entry = state.record(
        model=call.model, path=request.path, behaviour=behaviour.spec, outcome=outcome,
        stream=call.stream, prefill=answer.prefill, headers=headers,
    )  # fmt: skip
    if call.cache_marks:
        entry["cache_marks"] = list(call.cache_marks)
    if outcome in ERRORS:
        return _respond(wire.error(parse_as(behaviour, outcome), answer))
    if not (answer.cached or answer.writes):  # the behaviour's own figures stand first
        split = state.prompt_cache.split(call.cache_prefixes, answer.prompt_tokens)
        if split is not None:
            answer = replace(answer, cached=split[0], written=split[1], written_1h=split[2])
    entry["usage"] = wire.usage(answer)
    if outcome == "reset":
        _reset(request)
        return web.Response()
    before = behaviour.latency + (behaviour.first_token_delay if outcome == "slow_first" else 0.0)
    if outcome == "hang" or (not call.stream and outcome == "stall"):
        before = math.inf if outcome == "hang" else before + behaviour.seconds
    if before > 0 and not await _pause(request, before):
        entry["disconnected"] = True
        return web.Response()
    ids = Ids(state.next_id(), int(time.time()), call.model, state.name)
    if not call.stream:
        entry["tokens"] = answer.completion_tokens
        body = wire.whole(ids, answer, behaviour)
        if outcome == "malformed":
            body = b"{not json"
        return web.Response(body=body, content_type="application/json")
    return await _stream(request, entry, wire, outcome, behaviour, ids, answer)


def _outcome(rule: Rule, call: NativeCall) -> str:
    behaviour = rule.behaviour
    if behaviour.is_error_mode and not rule.should_fail(call.model):
        return "ok"
    if behaviour.name == "expired_token":
        expired = _EXPIRED.setdefault(rule, call.token or "")
        return "401" if call.token == expired else "ok"
    if behaviour.name in ("no_done", "bad_crc", "error_event") and not call.stream:
        return "ok"
    return behaviour.name


def parse_as(behaviour: Behaviour, outcome: str) -> Behaviour:
    """`expired_token` is answered as a 401."""
    return behaviour if outcome == behaviour.name else replace(behaviour, name=outcome)


async def _stream(
    request: web.Request,
    entry: dict[str, Any],
    wire: Wire,
    outcome: str,
    behaviour: Behaviour,
    ids: Ids,
    answer: Answer,
) -> web.StreamResponse:
    events = wire.events(ids, answer, behaviour)
    first = wire.opening(behaviour)
    tokens = len(events) - first - wire.closing(behaviour)
    fault_at = first + min(behaviour.after, tokens)
    response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
    response.content_type = wire.stream_type
    try:
        await response.prepare(request)
        for index, event in enumerate(events):
            if outcome == "cut" and index == fault_at:
                _close(request)
                return response
            if outcome == "error_event" and index == fault_at:
                await response.write(wire.error_event())
                await response.write_eof()
                return response
            wait = _wait(behaviour, outcome, index, fault_at)
            if wait > 0 and not await _pause(request, wait):
                raise ConnectionResetError("client went away")
            if outcome == "malformed" and index == behaviour.at:
                event = wire.malformed()
            if outcome == "bad_crc" and index == min(behaviour.at, len(events) - 1):
                event = wire.corrupt(event)
            await response.write(event)
            if first <= index < first + tokens:
                entry["tokens"] += 1
        if outcome == "no_done":
            _close(request)
            return response
        await response.write_eof()
    except ConnectionError:
        entry["disconnected"] = True
    return response


def _wait(behaviour: Behaviour, outcome: str, index: int, fault_at: int) -> float:
    if outcome == "slow_first":
        wait = 0.0 if index == 0 else behaviour.delay
    else:
        wait = behaviour.first_token_delay if index == 0 else behaviour.delay
        if index == 0 and behaviour.tail_p and random.random() < behaviour.tail_p:
            wait += behaviour.tail_delay
    if outcome == "stall" and index == fault_at:
        wait += behaviour.seconds
    return wait


def _respond(answer: tuple[int, bytes, dict[str, str]]) -> web.Response:
    status, body, headers = answer
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def bearer(request: web.Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None

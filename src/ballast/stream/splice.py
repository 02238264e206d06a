"""Joining a continuation onto what the client already has.

After a stream breaks, the next deployment either goes on from a prefill (its answer holds
only the rest) or regenerates the whole answer, which must begin with exactly what the client
has: the same text, the same reasoning, the same tool calls (same names, arguments that start
with the client's, character for character: a call cut inside a JSON string or one of its
escapes is matched as the text it is, never re-encoded). Only the remainder is relayed, and
only once everything the client has was said again: an answer that says something new first
(more text while a tool call the client has is still short, another call, text after a cut
reasoning) is another answer. Anything else is a divergence, and the stream ends with an error
event rather than a corrupted or truncated answer.

A prefill carries text only: while a tool call or reasoning is under way the answer is
regenerated (`Sent.prefill`). Reasoning that a continuation says before what the client has
(a model that thinks first, where the client's answer had no reasoning) is left out: it
cannot go before text the client already has."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ballast.stream.event import NOT_JSON, StreamEvent
from ballast.stream.state import REASONING_FIELDS, StreamState


@dataclass(frozen=True, slots=True)
class Sent:
    """What the client has of an answer."""

    text: str = ""
    reasoning: str = ""
    tools: dict[int, tuple[str, str]] = field(default_factory=dict)  # index -> (name, args)

    @property
    def plain(self) -> bool:
        """Only text: a prefill can carry it."""
        return not self.reasoning and not self.tools

    @property
    def prefill(self) -> str | None:
        """The text a continuation may go on from, or None: the answer must be regenerated
        (a tool call's arguments or reasoning are never prefilled, nor spliced into)."""
        return self.text if self.plain and self.text else None

    @classmethod
    def of(cls, state: StreamState) -> Sent:
        """What a stream said."""
        tools = {i: (t.name, t.args) for i, t in state.tools.items()}
        return cls(state.content, state.reasoning_text, tools)


class Diverged(Exception):
    """The continuation says something other than what the client has."""


def _longer(a: str, b: str) -> str:
    return a if len(a) >= len(b) else b


class Splice:
    """Filters a continuation stream: drops its role chunk, and when it regenerates, drops
    what the client already has and notices when the new answer says something else."""

    def __init__(self, sent: Sent, regenerate: bool) -> None:
        self.base = sent  # what the client had when this stream began
        self.regenerate = regenerate
        self.expect = sent if regenerate else Sent()
        # Reasoning the client's answer does not have, said before what it has: left out.
        self._quiet = not self.expect.reasoning and bool(sent.text or sent.tools)
        self._matched: dict[Any, int] = {}  # how much of each field has been seen again
        self._names: dict[int, str] = {}  # tool call names as the new stream gives them

    def sent(self, state: StreamState) -> Sent:
        """What the client has once this stream's events so far went through the splice
        (`state`: the stream's own, which saw them all)."""
        said = Sent.of(state)
        base = self.base
        reasoning = base.reasoning
        if not self.regenerate:
            if not self._quiet:
                reasoning += said.reasoning
            return Sent(base.text + said.text, reasoning, {**base.tools, **said.tools})
        # A regenerated field is a prefix of the client's, or the client's and what was
        # relayed after it: the longer of the two is what the client has.
        tools = dict(base.tools)
        for index, (name, args) in said.tools.items():
            had = tools.get(index, ("", ""))
            tools[index] = (_longer(had[0], name), _longer(had[1], args))
        if not self._quiet:
            reasoning = _longer(reasoning, said.reasoning)
        return Sent(_longer(base.text, said.text), reasoning, tools)

    def apply(self, event: StreamEvent) -> StreamEvent | None:
        """The event as the client should get it, or None to drop it. Raises Diverged."""
        if event.data is None:
            return event
        if event.done:
            if self._short():
                raise Diverged  # the new answer ended before reaching the client's
            return event
        payload = event.json
        if payload is NOT_JSON:
            raise Diverged
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return event
        # The event's payload is shared with whatever read it before: cut a copy of it.
        payload = copy.deepcopy(payload)
        choices = payload["choices"]
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)
            said = any(delta.values())
        else:  # a text completion's chunk
            piece = choice.get("text")
            if piece is not None:
                choice["text"] = self._match("text", self.expect.text, piece)
            said = bool(choice.get("text"))
        if (said or choice.get("finish_reason")) and self._short():
            # Something new, or the end, before all the client has was said again.
            raise Diverged
        if not said and not choice.get("finish_reason") and not payload.get("usage"):
            return None
        return StreamEvent.of(payload)

    def apply_all(self, events: list[StreamEvent]) -> list[StreamEvent]:
        """`apply` to each event in turn; the events the client should get."""
        out = []
        for event in events:
            kept = self.apply(event)
            if kept is not None:
                out.append(kept)
        return out

    def _delta(self, delta: dict[str, Any]) -> None:
        delta.pop("role", None)
        if "content" in delta:
            delta["content"] = self._match("text", self.expect.text, delta["content"])
        for name in REASONING_FIELDS:
            if name in delta:
                if self._quiet:
                    del delta[name]
                else:
                    delta[name] = self._match("reasoning", self.expect.reasoning, delta[name])
        if self._quiet:
            delta.pop("thinking_blocks", None)  # the signature of reasoning left out
        if "tool_calls" in delta:
            calls = self._calls(delta["tool_calls"])
            if calls:
                delta["tool_calls"] = calls
            else:
                del delta["tool_calls"]

    def _match(self, key: Any, expected: str, piece: Any) -> Any:
        """The part of `piece` the client does not have yet."""
        if piece is None:
            return None
        if not isinstance(piece, str):
            raise Diverged  # not text: nothing the client has can be matched against it
        done = self._matched.get(key, 0)
        remaining = len(expected) - done
        if remaining <= 0 or not piece:
            return piece
        head = piece[:remaining]
        if head != expected[done : done + len(head)]:
            raise Diverged
        self._matched[key] = done + len(head)
        return piece[len(head) :]

    def _calls(self, calls: Any) -> list[Any]:
        if not isinstance(calls, list):
            raise Diverged
        kept = []
        for call in calls:
            if not isinstance(call, dict):
                raise Diverged
            index = call.get("index", 0)
            want = self.expect.tools.get(index) if type(index) is int else None
            if want is None:  # a call the client has not seen: all of it is new
                kept.append(call)
                continue
            function = call.get("function")
            if not isinstance(function, dict):
                function = {}
            name = function.pop("name", None)
            if name is not None:
                given = self._names.get(index, "") + str(name)
                if not want[0].startswith(given):
                    raise Diverged  # another tool
                self._names[index] = given
            if "arguments" in function:
                rest = self._match(("args", index), want[1], function["arguments"])
                if rest:
                    function["arguments"] = rest
                else:
                    del function["arguments"]
            # The client has this call's id and type from the stream that broke.
            call.pop("id", None)
            call.pop("type", None)
            if function:
                call["function"] = function
                kept.append(call)
        return kept

    def _short(self) -> bool:
        """Something the client has was not said again."""
        expect = self.expect
        if self._matched.get("text", 0) < len(expect.text):
            return True
        if self._matched.get("reasoning", 0) < len(expect.reasoning):
            return True
        for index, (name, args) in expect.tools.items():
            if self._names.get(index, "") != name or self._matched.get(("args", index), 0) < len(
                args
            ):
                return True
        return False

"""What a streamed answer has said so far, read from its typed events: output seen (the
first-token clock), the text kept for continuation, the finish, the usage. The chat,
Responses and Messages semantics the transport does not know."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    """One tool call as a stream has built it so far."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    @property
    def args(self) -> str:
        return "".join(self.arguments)


# Delta fields that carry model output other than `content`. Reasoning comes as
# `reasoning_content` (DeepSeek, vLLM) or `reasoning` (OpenRouter, Ollama).
REASONING_FIELDS = ("reasoning_content", "reasoning")
# `thinking_blocks`: a thinking block's signature, or a redacted one (anthropic_wire.py):
# output no regenerated answer would repeat, so such a stream is never continued.
_OTHER_OUTPUT = ("refusal", "audio", "function_call", "thinking_blocks")
_TERMINAL = frozenset(("response.completed", "response.incomplete", "response.failed"))
# Content blocks of a Messages stream that come whole, with no deltas after them.
_STREAMED_BLOCKS = frozenset(("text", "thinking", "tool_use", "server_tool_use"))
# Where a Messages delta carries its output: text, thinking, a tool's input as JSON.
_MESSAGE_DELTA_TEXT = ("text", "thinking", "partial_json")
# A Messages text or thinking delta in Anthropic's own layout whose piece is printable ASCII
# with no escapes: its bytes are its characters, so it is read without a parse.
_PLAIN_DELTA = re.compile(
    rb' ?\{"type":"content_block_delta","index":\d+,"delta":\{"type":'
    rb'"(?:text_delta","text|thinking_delta","thinking)":"([ !#-\[\]-~]*)"\}\}'
)
# The other Messages events the state reads (`content_block_stop` and `ping` say nothing).
_MESSAGE_EVENTS = frozenset(
    ("message_start", "content_block_start", "message_delta", "message_stop")
)


@dataclass(slots=True)
class StreamState:
    """What has been said so far in one streamed answer (for the first-token clock,
    continuation, usage and checks). `output` turns true with the first delta that carries
    model output of any kind: text, a tool call, reasoning, a refusal, audio.

    The text is kept for continuation only, up to `limit` characters (content, reasoning and
    tool arguments together): past it the stream forgets it and is `untracked` (relayed on,
    never continued), so a long answer costs a stream bounded memory."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: dict[int, ToolCall] = field(default_factory=dict)
    output: bool = False
    untracked: bool = False  # output that continuation cannot match (refusal, audio, ...)
    finished: bool = False
    finish_reason: str | None = None  # the last choice's, for traces
    done: bool = False
    usage: dict[str, Any] | None = None
    malformed: int = 0
    limit: int = 1_000_000
    kept: int = 0  # characters of output seen (text, reasoning, tool arguments), kept or not
    pieces: int = 0  # the deltas that carried them

    @property
    def relayed_tokens(self) -> int:
        """The output tokens this stream carried, estimated when no usage says: a delta
        carries one token or more, a token is four characters or fewer (CJK text: one
        character a token, one a delta), so the larger of the two."""
        return max(self.pieces, -(-self.kept // 4))

    @property
    def content(self) -> str:
        return "".join(self.text)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    def observe(self, payload: Any) -> None:
        """Record one parsed data payload (a chat or text completion chunk). Runs for every
        event of every stream: written for the common shape (a delta with only `content`),
        with few calls; anything else takes `_observe_other`."""
        if not isinstance(payload, dict):
            return
        choices = payload.get("choices")
        if choices and isinstance(choices, list):
            choice = choices[0]
            if isinstance(choice, dict):
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    piece = delta.get("content")
                    if piece is None or len(delta) > 1:
                        self._observe_other(delta)
                else:
                    piece = choice.get("text")
                if piece and isinstance(piece, str):
                    self.output = True
                    self.kept += len(piece)
                    self.pieces += 1
                    if self.kept <= self.limit:
                        self.text.append(piece)
                    else:
                        self._forget()
                reason = choice.get("finish_reason")
                if reason:
                    self.finished = True
                    self.finish_reason = reason if isinstance(reason, str) else None
        elif "type" in payload:
            kind = payload["type"]
            if kind == "content_block_delta":  # most of a Messages stream
                self.output = self.untracked = True
                delta = payload.get("delta")
                if isinstance(delta, dict):  # text, thinking, a tool's input: all billed
                    for name in _MESSAGE_DELTA_TEXT:
                        piece = delta.get(name)
                        if isinstance(piece, str):
                            self.kept += len(piece)
                            self.pieces += 1
                            break
            elif type(kind) is str:  # each reads its own usage
                if kind in _MESSAGE_EVENTS:
                    self._observe_message(kind, payload)
                else:
                    self._observe_typed(kind, payload)
            return
        usage = payload.get("usage")
        if usage is not None and isinstance(usage, dict):
            self.usage = usage

    def observe_plain_delta(self, data: bytes) -> bool:
        """A Messages text or thinking delta read off its bytes, where they say all that
        `observe` would read of it (the characters of its piece); False when its data must
        be parsed. Most events of a Messages stream are such deltas."""
        match = _PLAIN_DELTA.fullmatch(data)
        if match is None:
            return False
        start, end = match.span(1)
        self.output = self.untracked = True
        self.kept += end - start
        self.pieces += 1
        return True

    def _observe_typed(self, kind: str, payload: dict[str, Any]) -> None:
        """An event of a Responses stream (one relayed as the upstream sent it): a delta is
        output, and a terminal event ends the answer with its usage (no `[DONE]` follows)."""
        if kind.endswith(".delta"):
            self.output = True
            piece = payload.get("delta")
            if isinstance(piece, str):  # text, reasoning, a call's arguments: all billed
                self.kept += len(piece)
                self.pieces += 1
            if kind == "response.output_text.delta" and isinstance(piece, str):
                if self.kept <= self.limit:
                    self.text.append(piece)
                else:
                    self._forget()
            else:
                self.untracked = True
        elif kind in _TERMINAL:
            self.finished = self.done = True
            response = payload.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                self.usage = usage

    def _observe_message(self, kind: str, payload: dict[str, Any]) -> None:
        """An event of a Messages stream relayed as the upstream sent it, but its deltas
        (`observe` reads those: they are output, never continued): a block that comes whole,
        such as redacted thinking, is output too; `message_start` and `message_delta` carry
        the usage, `message_stop` ends it."""
        if kind == "content_block_start":
            block = payload.get("content_block")
            if isinstance(block, dict) and block.get("type") not in _STREAMED_BLOCKS:
                self.output = self.untracked = True
        elif kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self.usage = dict(usage)
        elif kind == "message_delta":
            usage = payload.get("usage")
            if isinstance(usage, dict):  # the counts so far: they replace message_start's
                self.usage = {**(self.usage or {}), **usage}
            delta = payload.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            self.finished = True
            self.finish_reason = reason if isinstance(reason, str) else None
        elif kind == "message_stop":
            self.finished = self.done = True

    def _observe_other(self, delta: dict[str, Any]) -> None:
        calls = delta.get("tool_calls")
        if calls and isinstance(calls, list):
            self.output = True
            for call in calls:
                self._observe_call(call)
        for name in REASONING_FIELDS:
            piece = delta.get(name)
            if piece and isinstance(piece, str):
                self.output = True
                self.kept += len(piece)
                self.pieces += 1
                if self.kept <= self.limit:
                    self.reasoning.append(piece)
                else:
                    self._forget()
        for name in _OTHER_OUTPUT:
            if delta.get(name):
                self.output = True
                self.untracked = True

    def _forget(self) -> None:
        """Past the limit: no continuation will be asked, so the text kept for one goes."""
        self.untracked = True
        self.text.clear()
        self.reasoning.clear()
        for entry in self.tools.values():
            entry.arguments.clear()

    def _observe_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            self.untracked = True
            return
        index = call.get("index", 0)
        if type(index) is not int:
            self.untracked = True
            return
        entry = self.tools.get(index)
        if entry is None:
            entry = self.tools[index] = ToolCall()
        given_id = call.get("id")
        if isinstance(given_id, str) and entry.id is None:
            entry.id = given_id
        function = call.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str):
                entry.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                if arguments:
                    self.kept += len(arguments)
                    self.pieces += 1
                    if self.kept <= self.limit:
                        entry.arguments.append(arguments)
                    else:
                        self._forget()
            elif arguments is not None:
                self.untracked = True

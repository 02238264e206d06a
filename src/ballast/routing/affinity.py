"""Prompt-cache affinity: the requests of one conversation go to the deployment that answered
it last, while that deployment is ready, so the provider's prompt cache there stays warm.

A conversation is named by what its client says of it, else by the head of its prompt:

- chat completions and Responses: `prompt_cache_key`, else `user` (OpenAI's cache routing
  read it before `prompt_cache_key` existed; a bridged Messages request's
  `metadata.user_id` arrives as it);
- Messages: `metadata.user_id`;
- else the leading system text (`system`, `instructions`, system and developer messages)
  and the first other message, `cache_control` marks left out. That head is what every
  turn of a conversation repeats. The prefix up to the last `cache_control` mark would not
  do: clients mark the newest message, so it changes every turn.

The key is read from the body parsed once already (a few dictionary reads; the head's
strings are hashed where they are, other values encoded once by orjson), and only for a
group with more than one deployment. It is Python's hash: salted per process, which is
fine for a map each worker keeps to itself, and a collision only changes an order."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable
from typing import Any

import orjson

from ballast.config import ModelGroup
from ballast.resilience.clock import Clock
from ballast.routing.targets import Target

_SYSTEM = ("system", "developer")


class Affinity:
    """Which deployment answered a conversation last, per model group: an LRU map bounded
    by `limit` entries, each forgotten `ttl` seconds after its last answer. One per worker
    and configuration generation; it only ever orders deployments the strategy ranked.

    A failover does not outlast the recovery it covered for: an answer given after another
    deployment of the group failed the same request is not kept (the strategy, which has
    seen the failure, decides the next turn), and one given while some of the group was
    out (breaker open, cooling down, drained) names those deployments and lapses as soon
    as one of them is ready again, so a recovered, faster deployment gets its traffic back."""

    __slots__ = ("_clock", "_entries", "_limit", "_ttl")

    def __init__(self, limit: int, ttl: float, clock: Clock) -> None:
        self._limit = limit
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[int, tuple[str, float, tuple[Target, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: int) -> str | None:
        """The deployment that answered `key` last, unless that was `ttl` ago or more, or
        a deployment that was out then is ready now."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock.monotonic()
        if entry[1] <= now or any(out.ready(now) for out in entry[2]):
            del self._entries[key]
            return None
        return entry[0]

    def served(self, key: int, deployment: str, out: tuple[Target, ...] = ()) -> None:
        """`deployment` answered `key`: it is the one to prefer for the next `ttl`, or
        until one of `out` (the group's deployments that were not ready) is ready."""
        entries = self._entries
        entries[key] = (deployment, self._clock.monotonic() + self._ttl, out)
        entries.move_to_end(key)
        if len(entries) > self._limit:
            entries.popitem(last=False)

    def order(self, group: ModelGroup, ranked: list[Target], conversation: int) -> list[Target]:
        """`ranked` with the deployment that answered `conversation` last put first, when it
        is ready (breaker closed, not cooling, not drained); else `ranked` as it is, so
        health and failover decide as they would without affinity."""
        preferred = self.get(group_key(group.name, conversation))
        if preferred is None or ranked[0].id == preferred:
            return ranked
        for index, target in enumerate(ranked):
            if target.id == preferred:
                if target.ready(self._clock.monotonic()):
                    return [target, *ranked[:index], *ranked[index + 1 :]]
                break
        return ranked

    def answered(
        self,
        target: Target,
        conversation: int,
        members: list[Target],
        failed: Collection[str | None] = (),
    ) -> None:
        """`target` answered (a whole answer, or a stream's first token: by then it has read
        the prompt and cached it): the conversation's next requests prefer it, in a group
        that keeps conversations to a deployment. `members` is the group, `failed` the
        deployments this request failed on before."""
        group = target.group
        if len(members) < 2 or not group.prompt_affinity:
            return
        key = group_key(group.name, conversation)
        if failed and any(m.id in failed for m in members):
            self._entries.pop(key, None)
            return
        now = self._clock.monotonic()
        out = tuple(m for m in members if m is not target and not m.ready(now))
        self.served(key, target.id, out)


def group_key(group: str, conversation: int) -> int:
    """A conversation's key within one model group: a conversation that asks two models
    (a small one for chores, a large one for the work) keeps a deployment in each."""
    return hash((group, conversation))


def conversation(path: str, payload: dict[str, Any]) -> int | None:
    """The conversation a request belongs to, for the API it is sent in; None when it
    names none and has no prompt to tell it by (an embedding, a legacy completion)."""
    if path == "/chat/completions":
        named = payload.get("prompt_cache_key") or payload.get("user")
        if isinstance(named, str):
            return hash(named)
        return _head((), payload.get("messages"))
    if path == "/responses":
        named = payload.get("prompt_cache_key") or payload.get("user")
        if isinstance(named, str):
            return hash(named)
        given = payload.get("input")
        instructions = payload.get("instructions")
        if isinstance(given, str):
            return hash((_part(instructions), given))
        return _head((_part(instructions),), given)
    if path == "/messages":
        metadata = payload.get("metadata")
        named = metadata.get("user_id") if isinstance(metadata, dict) else None
        if isinstance(named, str):
            return hash(named)
        messages = payload.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        content = first.get("content") if isinstance(first, dict) else None
        return hash((_part(payload.get("system")), _part(content)))
    return None


def _head(parts: tuple[Hashable, ...], messages: Any) -> int | None:
    """`parts`, then the leading system messages and the first other one (its content, or
    the whole item where it has none: a Responses item that is not a message)."""
    if not isinstance(messages, list) or not messages:
        return hash(parts) if parts else None
    head = list(parts)
    for message in messages:
        if not isinstance(message, dict):
            head.append(_part(message))
            break
        content = message.get("content")
        head.append(_part(message if content is None else content))
        if message.get("role") not in _SYSTEM:
            break
    return hash(tuple(head))


def _part(value: Any) -> Hashable:
    """A hashable form of a prompt's piece that leaves `cache_control` marks out (a client
    moves them as the conversation grows): a string as it is, a list piece by piece."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(_block(block) for block in value)
    if isinstance(value, dict):
        return _block(value)
    return _dumped(value)


def _block(block: Any) -> Hashable:
    if isinstance(block, dict):
        text = block.get("text")
        if isinstance(text, str):
            return text
        if "cache_control" in block:
            block = {name: value for name, value in block.items() if name != "cache_control"}
    return _dumped(block)


def _dumped(value: Any) -> Hashable:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # not from a JSON body: no key of its own
        return None

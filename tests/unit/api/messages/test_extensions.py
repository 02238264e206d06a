"""What a bridged request may lose on its way, named before any deployment is chosen: what
no form carries, and each extension a deployment of the chain cannot carry."""

from __future__ import annotations

from ballast.api.messages.extensions import Notes, left_out

ANTHROPIC = frozenset(("cache_control", "thinking"))
BEDROCK = frozenset(("cache_control",))
CHAT: frozenset[str] = frozenset()


def test_a_form_carries_what_it_keeps_and_names_the_rest_once() -> None:
    notes = Notes([], BEDROCK, [])
    into: dict[str, object] = {}
    assert notes.mark({"cache_control": {"type": "ephemeral"}}, into)
    assert into == {"cache_control": {"type": "ephemeral"}}
    assert not notes.mark({"cache_control": None}, into)  # null asks for nothing
    assert not notes.carry("thinking") and not notes.carry("thinking")
    assert not notes.carry("redacted_thinking")
    notes.drop("top_k")
    assert notes.kept == ["cache_control"]
    assert notes.dropped == ["thinking", "redacted_thinking", "top_k"]


def test_what_each_deployment_of_the_chain_would_lose_is_named() -> None:
    kept = ["cache_control", "thinking", "redacted_thinking"]
    assert left_out(["top_k"], kept, [ANTHROPIC]) == ("top_k",)
    assert left_out([], kept, [ANTHROPIC, BEDROCK]) == ("thinking", "redacted_thinking")
    assert left_out([], kept, [ANTHROPIC, CHAT]) == tuple(kept)
    assert left_out(["top_k"], [], [CHAT]) == ("top_k",)

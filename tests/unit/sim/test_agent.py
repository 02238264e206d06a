"""The simulator as strict as the providers where agents depend on it: signed thinking, a
tool turn refused without it, a stateless tool call refused without its encrypted
reasoning; and the agent shape's choice of tool."""

from __future__ import annotations

from typing import Any

from ballast.sim.agent import (
    THINKING_TEXT,
    agent_call,
    encrypted_reasoning,
    reasoning_problem,
    sign,
    thinking_problem,
    tool_results,
)

ON: Any = {"type": "enabled", "budget_tokens": 1024}
USE = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}


def _turn(*blocks: Any, thinking: Any = ON) -> dict[str, Any]:
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": list(blocks)}]
    return {"thinking": thinking, "messages": [*messages, RESULT]}


def test_a_tool_turn_needs_its_signed_thinking_block() -> None:
    signed = {"type": "thinking", "thinking": THINKING_TEXT, "signature": sign(THINKING_TEXT)}
    assert thinking_problem(_turn(signed, USE)) is None
    assert thinking_problem(_turn({"type": "redacted_thinking", "data": "x"}, USE)) is None
    lost = thinking_problem(_turn(USE))
    assert lost is not None and "Expected `thinking` or `redacted_thinking`" in lost
    assert thinking_problem(_turn(USE, thinking=None)) is None  # thinking off: none needed
    forged = thinking_problem(_turn({**signed, "signature": ""}, USE))
    assert forged is not None and "Invalid `signature`" in forged
    edited = thinking_problem(_turn({**signed, "thinking": "changed"}, USE))
    assert edited is not None and "Invalid `signature`" in edited


def test_a_stateless_tool_call_needs_its_encrypted_reasoning() -> None:
    call = {"type": "function_call", "call_id": "call_sim_r3", "name": "f", "arguments": "{}"}
    reasoning: Any = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": encrypted_reasoning(3),
    }
    kept: Any = {"store": False, "input": [reasoning, call]}
    assert reasoning_problem(kept) is None
    lost = reasoning_problem({"store": False, "input": [call]})
    assert lost is not None and "'rs_sim3'" in lost
    forged = {**reasoning, "encrypted_content": encrypted_reasoning(4)}
    assert reasoning_problem({"store": False, "input": [forged, call]}) is not None
    assert reasoning_problem({"input": [call]}) is None  # stored state: nothing to carry


def test_the_agent_calls_an_offered_tool_and_reads_what_came_back() -> None:
    schema = {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path", "limit"],
    }
    body: Any = {"tools": [{"name": "Read", "input_schema": schema}], "messages": [RESULT]}
    assert agent_call(body, "Read", "/tmp/x") == {"file_path": "/tmp/x"}
    assert agent_call(body, "Write", "/tmp/x") is None
    assert tool_results(body) == [""]
    assert tool_results({"messages": [{"role": "user", "content": "go"}]}) == []


def test_the_tool_results_counted_are_those_of_the_loop_under_way() -> None:
    def result(content: Any) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "content": content}]}

    call = {"role": "assistant", "content": [USE]}
    blocks = [{"type": "text", "text": "two"}, {"type": "image"}, {"type": "text", "text": "!"}]
    earlier = [{"role": "user", "content": "go"}, call, result("old")]
    now = [{"role": "user", "content": [{"type": "text", "text": "again"}]}, call]
    body = {"messages": [*earlier, *now, result("one"), call, result(blocks)]}
    assert tool_results(body) == ["one", "two!"]
    assert tool_results({"messages": [*earlier, *now]}) == []

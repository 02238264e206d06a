"""What the simulator does for coding agents, as strictly as the providers do where agents
depend on it: thinking blocks signed, and a tool turn refused without its signed thinking
block (Anthropic's rules); with `store: false`, a reasoning model's tool call refused without
the encrypted reasoning item that came with it (OpenAI's). A gateway that loses either fails
here as it would in production. And the `agent` shape's tool loop: call a tool the
request offers, as many times as asked, then answer once the results are back."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

THINKING_TEXT = "thinking (sim)"
_KEY = b"ballast-sim-thinking"  # the simulator's own: signatures mean "this sim made it"


def sign(thinking: str) -> str:
    """The signature of a thinking block's text, as the simulator makes and checks it."""
    digest = hmac.new(_KEY, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def thinks(body: dict[str, Any]) -> bool:
    """Whether the request turns extended thinking on."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def thinking_problem(body: dict[str, Any]) -> str | None:
    """Anthropic's refusal of a conversation whose thinking blocks do not hold: a signature
    this simulator did not make, or (thinking on) a final assistant turn that calls a tool,
    or a prefill (the request's last message an assistant turn), without opening with its
    thinking block. None when it holds."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    last = messages[-1] if messages else None
    if thinks(body) and isinstance(last, dict) and last.get("role") == "assistant":
        content = last.get("content")
        blocks = [{"type": "text"}] if isinstance(content, str) else content
        first = blocks[0] if isinstance(blocks, list) and blocks else None
        kind = first.get("type") if isinstance(first, dict) else None
        if kind not in ("thinking", "redacted_thinking"):
            return (
                f"messages.{len(messages) - 1}.content.0.type: Expected `thinking` or"
                f" `redacted_thinking`, but found `{kind}`. When `thinking` is enabled, a"
                " final `assistant` message must start with a thinking block"
            )
    last_assistant = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        last_assistant = (i, content)
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "thinking":
                text, signature = block.get("thinking"), block.get("signature")
                if not isinstance(text, str) or signature != sign(text):
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    if not thinks(body) or last_assistant is None:
        return None
    i, content = last_assistant
    kinds = [b.get("type") for b in content if isinstance(b, dict)]
    if "tool_use" in kinds and kinds[0] not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but"
            f" found `{kinds[0]}`. When `thinking` is enabled, a final `assistant` message"
            " must start with a thinking block"
        )
    return None


def tool_results(body: dict[str, Any]) -> list[str]:
    """The text of each tool result of the loop under way: the results in the user turns
    since the last one that carries none (the prompt), in order. Empty before any call."""
    messages = body.get("messages")
    turns: list[Any] = messages if isinstance(messages, list) else []
    results: list[str] = []
    for message in reversed(turns):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = [
            b
            for b in (content if isinstance(content, list) else ())
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if not blocks:
            break
        results[:0] = [_text(b.get("content")) for b in blocks]
    return results


def _text(content: Any) -> str:
    """A tool result's content as text: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    return "".join(
        b["text"]
        for b in (content if isinstance(content, list) else ())
        if isinstance(b, dict) and isinstance(b.get("text"), str)
    )


def agent_call(body: dict[str, Any], name: str, value: str) -> dict[str, Any] | None:
    """The input of a call to the offered tool `name`: each required string property set
    to `value`. None when the request offers no such tool."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("name") == name:
            schema = tool.get("input_schema")
            schema = schema if isinstance(schema, dict) else {}
            required = schema.get("required")
            properties = schema.get("properties")
            properties = properties if isinstance(properties, dict) else {}
            return {
                key: value
                for key in (required if isinstance(required, list) else ())
                if isinstance(properties.get(key), dict) and properties[key].get("type") == "string"
            }
    return None


def encrypted_reasoning(number: int) -> str | None:
    """The opaque `encrypted_content` of answer `number`'s reasoning item."""
    return sign(f"rs_sim{number}")


def wants_encrypted_reasoning(body: dict[str, Any]) -> bool:
    """A reasoning request that keeps no state (`store: false`) and asks for its reasoning
    back encrypted, as Codex does."""
    include = body.get("include")
    return (
        body.get("store") is False
        and isinstance(body.get("reasoning"), dict)
        and isinstance(include, list)
        and "reasoning.encrypted_content" in include
    )


def reasoning_problem(body: dict[str, Any]) -> str | None:
    """OpenAI's refusal of a stateless conversation that sends back this simulator's tool
    call without the encrypted reasoning item it came with (or with one altered)."""
    given = body.get("input")
    if body.get("store") is not False or not isinstance(given, list):
        return None
    carried = {
        item.get("encrypted_content")
        for item in given
        if isinstance(item, dict) and item.get("type") == "reasoning"
    }
    for item in given:
        if not isinstance(item, dict) or item.get("type") != "function_call":
            continue
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id.startswith("call_sim_r"):
            continue  # not a call this simulator made with reasoning
        number = call_id.removeprefix("call_sim_r")
        if not number.isdigit() or encrypted_reasoning(int(number)) not in carried:
            return (
                f"Item with call_id '{call_id}' of type 'function_call' was provided without"
                f" its required 'reasoning' item: 'rs_sim{number}'."
            )
    return None

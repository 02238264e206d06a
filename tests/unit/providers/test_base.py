"""The one decision whether a continuation is prefilled (`Adapter.continues`): only by a
deployment that continues one, never with reasoning on, and the body a deployment is sent
agrees with it (a prefill it would refuse is never sent)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ballast.config import Deployment, Timeouts, UpstreamSettings
from ballast.providers import ADAPTERS
from ballast.providers.base import Adapter, AdapterContext, thinking_on
from ballast.upstream.client import Upstream

HI: list[Any] = [{"role": "user", "content": "hi"}]


class _Call:
    raw = b""
    model = "chat"
    credential = "c"
    request_id = None
    forwarded: tuple[tuple[str, str], ...] = ()
    bridge = None
    extended = False

    def __init__(
        self,
        payload: dict[str, Any],
        edits: dict[str, Any] | None = None,
        path: str = "/chat/completions",
    ) -> None:
        self.path = path
        self.payload = payload
        self.edits = edits or {}
        self.raw = orjson.dumps(payload)


def adapter(provider: str, **extra: Any) -> Adapter:
    if provider == "bedrock":
        extra.setdefault("aws", {"region": "us-east-1"})
    if provider == "gemini":
        extra.setdefault("api_key", "k")
    settings = {"id": "d", "url": "https://upstream.example", "model": "m", "provider": provider}
    deployment = Deployment.model_validate({**settings, **extra})
    upstream = Upstream(deployment, Timeouts(), UpstreamSettings())
    return ADAPTERS[provider](deployment, upstream, AdapterContext())


def turns(body: bytes) -> list[str]:
    """The roles of the turns a body carries, whatever the provider's format."""
    sent = orjson.loads(body)
    messages = sent.get("messages") or sent.get("contents")
    return [m["role"] for m in messages]


@pytest.mark.parametrize(
    ("provider", "extra", "continues"),
    [
        ("openai", {}, False),
        ("openai", {"supports_prefill": True}, True),
        ("vllm", {}, False),
        ("vllm", {"supports_prefill": True}, True),
        ("anthropic", {}, True),  # Messages continues a prefill unless told its model refuses
        ("anthropic", {"supports_prefill": False}, False),
        ("bedrock", {}, False),
        ("bedrock", {"supports_prefill": True}, True),
        ("gemini", {"supports_prefill": True}, True),
    ],
)
def test_a_prefill_goes_only_to_a_deployment_that_continues_it(
    provider: str, extra: dict[str, Any], continues: bool
) -> None:
    target = adapter(provider, **extra)
    call = _Call({"model": "chat", "messages": HI, "max_tokens": 50})
    assert target.continues(call, "tok0 tok1 ") is continues
    roles = turns(target.body(call, "chat", "tok0 tok1 "))
    assert roles[0] == "user" and len(roles) == (2 if continues else 1)  # then its own turn


@pytest.mark.parametrize(
    "reasoning",
    [
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"thinking": {"type": "adaptive"}},
        {"chat_template_kwargs": {"enable_thinking": True}},
        {"reasoning_effort": "high"},
    ],
)
@pytest.mark.parametrize("provider", ["anthropic", "vllm", "bedrock"])
def test_with_reasoning_on_no_prefill_is_sent(provider: str, reasoning: dict[str, Any]) -> None:
    target = adapter(provider, supports_prefill=True)
    payload = {"model": "chat", "messages": HI, "max_tokens": 50}
    for call in (_Call({**payload, **reasoning}), _Call(payload, edits=reasoning)):
        assert target.continues(call, "tok0 tok1") is False
        body = target.body(call, "chat", "tok0 tok1")
        assert turns(body) == ["user"]
        assert b"continue_final_message" not in body


def test_reasoning_off_is_not_reasoning() -> None:
    assert not thinking_on({"thinking": {"type": "disabled"}})
    assert not thinking_on({"reasoning_effort": "none"})
    assert not thinking_on({"chat_template_kwargs": {"enable_thinking": False}})
    assert not thinking_on({"messages": HI})


def test_vllm_is_asked_to_continue_the_final_message() -> None:
    call = _Call({"model": "chat", "messages": HI})
    sent = orjson.loads(adapter("vllm", supports_prefill=True).body(call, "chat", "tok0 "))
    assert sent["messages"][-1] == {"role": "assistant", "content": "tok0 "}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False


@pytest.mark.parametrize("provider", ["anthropic", "bedrock"])
def test_a_prefill_of_white_space_only_is_regenerated_where_it_would_go_without_it(
    provider: str,
) -> None:
    target = adapter(provider, supports_prefill=True)
    call = _Call({"model": "chat", "messages": HI, "max_tokens": 50})
    assert target.continues(call, " \n") is False
    assert turns(target.body(call, "chat", " \n")) == ["user"]


def test_a_text_completion_grows_its_prompt() -> None:
    call = _Call({"model": "chat", "prompt": "Once"}, path="/completions")
    target = adapter("openai")
    assert target.continues(call, " upon") is True
    assert orjson.loads(target.body(call, "chat", " upon"))["prompt"] == "Once upon"
    assert adapter("anthropic").continues(call, " upon") is False  # it serves chat only

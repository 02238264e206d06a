"""`POST /v1/responses` through Ballast with the official openai SDK, both ways it is
served: bridged to a chat completion, and natively to a deployment's own `/responses`. The
SDK's parsed objects are what is asserted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest

from ballast.sim.server import SimServer
from tests.stack import Gateway, Stack, deployment, group

FULL = "".join(f"tok{i} " for i in range(16))
WAYS = ["bridged", "native"]


@pytest.fixture
def served(stack: Stack) -> Iterator[tuple[Stack, SimServer, Gateway]]:
    sim = stack.sim()
    config = {
        "models": [
            group("bridged", deployment("b", sim, model="sim-chat")),
            group("native", deployment("n", sim, model="sim-native", responses="native")),
        ]
    }
    yield stack, sim, stack.gateway(config)


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0)


@pytest.mark.parametrize("model", WAYS)
def test_text_whole_and_streamed(served: tuple[Stack, SimServer, Gateway], model: str) -> None:
    stack, sim, gateway = served
    api = sdk(gateway)
    response = api.responses.create(
        model=model, input="hello there", instructions="be brief", metadata={"k": "v"}
    )
    assert response.output_text == FULL
    assert response.status == "completed" and response.id.startswith("resp_")
    assert response.usage is not None and response.usage.output_tokens == 16
    assert response.usage.total_tokens == response.usage.input_tokens + 16
    assert response.metadata == {"k": "v"}
    with api.responses.stream(model=model, input="hi", max_output_tokens=20) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == FULL
    assert final.output_text == FULL and final.usage is not None
    paths = {a["path"] for a in stack.attempts(sim)}
    assert paths == {"/v1/chat/completions" if model == "bridged" else "/v1/responses"}


@pytest.mark.parametrize("model", WAYS)
@pytest.mark.parametrize("streamed", [False, True])
def test_a_function_tool_round_trip(
    served: tuple[Stack, SimServer, Gateway], model: str, streamed: bool
) -> None:
    stack, sim, gateway = served
    stack.set_behaviour(sim, "ok?shape=tool&tokens=3")
    api = sdk(gateway)
    tools: list[Any] = [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "strict": False,
        }
    ]
    asked: list[Any] = [{"role": "user", "content": "look it up"}]
    if streamed:
        with api.responses.stream(model=model, input=asked, tools=tools) as stream:
            kinds = [e.type for e in stream]
            first = stream.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
    else:
        first = api.responses.create(model=model, input=asked, tools=tools)  # type: ignore[assignment]
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "lookup" and call.arguments == '{"q": "tok0 tok1 tok2 "}'
    follow: list[Any] = [
        *asked,
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a greeting"},
    ]  # fmt: skip
    second = api.responses.create(model=model, input=follow, tools=tools)
    assert second.output_text == "tok0 tok1 tok2 "


class Found(pydantic.BaseModel):
    q: str


@pytest.mark.parametrize("model", WAYS)
def test_json_schema_output(served: tuple[Stack, SimServer, Gateway], model: str) -> None:
    _, _, gateway = served
    api = sdk(gateway)
    parsed = api.responses.parse(model=model, input="find it", text_format=Found)
    assert parsed.output_parsed == Found(q=FULL)
    with api.responses.stream(model=model, input="find it", text_format=Found) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_parsed == Found(q=FULL)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_123"}, "conversation"),
        ({"background": True}, "background"),
    ],
)
def test_what_the_bridge_cannot_honour_is_a_400_naming_it(
    served: tuple[Stack, SimServer, Gateway], extra: dict[str, Any], param: str
) -> None:
    stack, sim, gateway = served
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(gateway).responses.create(model="bridged", input="x", **extra)
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert stack.attempts(sim) == []  # refused before anything went upstream


def test_tools_the_bridge_cannot_run_are_dropped_and_named(
    served: tuple[Stack, SimServer, Gateway],
) -> None:
    _, _, gateway = served
    tools: Any = [
        {"type": "web_search"},
        {"type": "code_interpreter", "container": {"type": "auto"}},
    ]
    raw = sdk(gateway).responses.with_raw_response.create(model="bridged", input="x", tools=tools)
    assert raw.headers["x-ballast-dropped"] == "tools.web_search,tools.code_interpreter"
    assert raw.parse().status == "completed"

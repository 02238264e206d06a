"""Agent frameworks that speak the Responses API, pointed at Ballast: the `openai-agents`
package runs a one-tool agent, and LangChain's `ChatOpenAI(use_responses_api=True)` invokes
and streams; bridged and native alike."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from langchain_openai import ChatOpenAI

from tests.stack import Stack, deployment, group

FULL = "".join(f"tok{i} " for i in range(16))
WAYS = ["bridge", "native"]


def gateway_url(stack: Stack, way: str, behaviour: str = "ok") -> str:
    sim = stack.sim(behaviour)
    config = {"models": [group("chat", deployment("a", sim, model="sim-m", responses=way))]}
    return stack.gateway(config).url + "/v1"


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_one_tool_agent_runs_to_its_answer(stack: Stack, way: str, streamed: bool) -> None:
    url = gateway_url(stack, way, "ok?shape=tool&tokens=3")
    asked: list[str] = []

    @function_tool
    def lookup(q: str) -> str:
        """Look a word up."""
        asked.append(q)
        return "a greeting"

    client = openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0)
    model = OpenAIResponsesModel(model="chat", openai_client=client)
    agent = Agent(name="helper", instructions="Use the tool.", tools=[lookup], model=model)
    run_config = RunConfig(tracing_disabled=True)
    if streamed:
        running = Runner.run_streamed(agent, "look it up", run_config=run_config)
        kinds = {event.type async for event in running.stream_events()}
        assert "raw_response_event" in kinds
        result: Any = running
    else:
        result = await Runner.run(agent, "look it up", run_config=run_config)
    assert asked == ["tok0 tok1 tok2 "]  # the model's call reached the tool
    assert result.final_output == "tok0 tok1 tok2 "  # and its result reached the model
    await client.close()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


@pytest.mark.parametrize("way", WAYS)
def test_langchain_invokes_and_streams(stack: Stack, way: str) -> None:
    llm = ChatOpenAI(
        model="chat",
        base_url=gateway_url(stack, way),
        api_key="sk-client",
        use_responses_api=True,
        max_retries=0,
    )
    message = llm.invoke("hello there")
    assert _text(message.content) == FULL
    assert message.usage_metadata is not None and message.usage_metadata["output_tokens"] == 16
    pieces = [_text(chunk.content) for chunk in llm.stream("hello there")]
    assert "".join(pieces) == FULL and len([p for p in pieces if p]) > 1

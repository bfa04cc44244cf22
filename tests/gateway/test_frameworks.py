"""Agent frameworks pointed at the gateway, and a route through litellm to another
real draftgate server."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.gateway.conftest import KEY

pytestmark = pytest.mark.slow
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GREEDY = {"temperature": 0, "max_tokens": 20}
HELLO = [{"role": "user", "content": "Name two planets."}]


def test_litellm_as_a_client(gateway_url: str) -> None:
    import litellm

    out = litellm.completion(model="openai/smollm2-135m", api_base=gateway_url, api_key=KEY, messages=HELLO,
                             **GREEDY)
    assert out.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(
        model="openai/smollm2-135m", api_base=gateway_url, api_key=KEY, messages=HELLO, stream=True, **GREEDY)
        if c.choices)
    assert streamed == out.choices[0].message.content


def test_an_upstream_route_gives_what_the_upstream_gives(gateway_url: str, upstream_url: str) -> None:
    """remote-smollm goes through litellm to the upstream server: the same greedy text as asking it directly."""
    direct = openai.OpenAI(base_url=upstream_url, api_key="dev", max_retries=0)
    via = openai.OpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
    want = direct.chat.completions.create(model="smollm2-135m", messages=HELLO, **GREEDY)  # type: ignore[arg-type]
    got = via.chat.completions.create(model="remote-smollm", messages=HELLO, **GREEDY)  # type: ignore[arg-type]
    assert got.model == "remote-smollm" and got.choices[0].message.content == want.choices[0].message.content
    assert got.usage is not None and got.usage.completion_tokens == (want.usage.completion_tokens if want.usage else -1)
    stream = via.chat.completions.create(model="remote-smollm", messages=HELLO, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY)  # type: ignore[arg-type]
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert any(c.usage is not None for c in chunks)
    assert chunks[-1].model_extra and "target_passes" in chunks[-1].model_extra["draftgate"]  # the upstream's own


def test_an_upstream_refusal_comes_back_in_the_envelope(gateway_url: str) -> None:
    via = openai.OpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as info:
        via.chat.completions.create(model="remote-smollm", messages=HELLO, tools=tools,
                                    tool_choice={"type": "function", "function": {"name": "absent"}})
    assert "absent" in str(info.value) and info.value.code == "upstream_invalid_request"


class Planet(BaseModel):
    name: str
    has_rings: bool


def test_langchain_chat_openai(gateway_url: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="smollm2-135m", base_url=gateway_url, api_key=KEY, temperature=0,  # type: ignore[arg-type]
                     max_tokens=48, stream_usage=True, max_retries=0)
    reply = llm.invoke("Name two planets.")
    assert isinstance(reply.content, str) and reply.content

    parts = list(llm.stream("Name two planets."))
    assert "".join(str(p.content) for p in parts) == reply.content
    assert any(p.usage_metadata for p in parts)

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"sunny in {city}"

    call = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Oslo?")
    assert call.tool_calls and call.tool_calls[0]["name"] == "get_weather"  # type: ignore[attr-defined]
    assert isinstance(call.tool_calls[0]["args"].get("city"), str)  # type: ignore[attr-defined]

    planet = llm.with_structured_output(Planet).invoke("Describe Saturn.")
    assert isinstance(planet, Planet) and planet.name


def test_openai_agents_sdk_calls_a_tool_and_answers(gateway_url: str) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return json.dumps({"city": city, "weather": "sunny", "celsius": 21})

    async def main() -> str:
        client = openai.AsyncOpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
        agent = Agent(
            name="weather", instructions="You answer questions about the weather using the tool.",
            model=OpenAIChatCompletionsModel(model="smollm2-135m", openai_client=client),
            model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
            tools=[get_weather],
        )
        result = await Runner.run(agent, "What is the weather in Lisbon?", max_turns=4)
        await client.close()
        return str(result.final_output)

    answer = asyncio.run(main())
    assert calls, "the agent called its tool"
    assert answer.strip()

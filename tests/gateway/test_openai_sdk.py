"""The openai SDK (sync and async) against a real gateway on loopback, on the real embedded model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.gateway.conftest import KEY

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
HELLO = [{"role": "user", "content": "Name three colours of the rainbow."}]
WEATHER_TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Lisbon right now?"}]


@pytest.fixture(scope="module")
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)


def test_plain_completion_with_usage_and_speculation_stats(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=24, temperature=0)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == MODEL and out.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens <= 24
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    stats = (out.model_extra or {})["draftgate"]
    assert stats["speculative"] is True and stats["target_passes"] >= 1
    assert 0.0 <= stats["acceptance_rate"] <= 1.0 and stats["mean_acceptance_length"] >= 1.0


def test_speculation_off_gives_the_same_greedy_text(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 32, "temperature": 0}
    on = client.chat.completions.create(**args)
    off = client.chat.completions.create(**args, extra_body={"speculative": False})
    assert on.choices[0].message.content == off.choices[0].message.content
    off_stats = (off.model_extra or {})["draftgate"]
    assert off_stats["speculative"] is False and off_stats["draft_tokens"] == 0


def test_streaming_with_usage_matches_the_plain_completion(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 24, "temperature": 0}
    plain = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and plain.usage is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(last.usage, k) for k in counts] == [getattr(plain.usage, k) for k in counts]
    # the same prompt right after on the same route: all but its last token come from the cache the
    # plain request left (exact: the same text came out)
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens == plain.usage.prompt_tokens - 1
    assert all(c.usage is None for c in chunks[:-1])
    assert (last.model_extra or {})["draftgate"]["target_passes"] >= 1


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_are_valid_calls(client: openai.OpenAI, choice: Any) -> None:
    out = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,
                                         tool_choice=choice, max_tokens=64, temperature=0)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and c.message.tool_calls
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    schema = next(t["function"]["parameters"] for t in WEATHER_TOOLS if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_tool_choice_none_answers_in_text(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,
                                         tool_choice="none", max_tokens=24, temperature=0)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


def test_tool_choice_auto_gives_text_or_a_valid_call(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,
                                         tool_choice="auto", max_tokens=64, temperature=0)
    c = out.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls:
            assert call.function.name in {"get_weather", "get_time"}
            json.loads(call.function.arguments)
    else:
        assert c.message.content and c.finish_reason in ("stop", "length")


def test_a_named_tool_absent_from_tools_is_a_clear_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "book_flight"}})
    assert info.value.code == "tool_not_found" and "book_flight" in str(info.value)


def test_a_streamed_tool_call_arrives_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,
                                            tool_choice="required", max_tokens=64, temperature=0, stream=True)
    name, args, ids, finish = "", "", set(), None
    for chunk in stream:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            assert d.index == 0
            if d.id:
                ids.add(d.id)
            name += d.function.name or "" if d.function else ""
            args += d.function.arguments or "" if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(ids) == 1 and name in {"get_weather", "get_time"}
    assert isinstance(json.loads(args), dict)
    # the SDK's stream helper assembles a pure tool call with content None, as a non-streamed reply has
    with client.chat.completions.stream(model=MODEL, messages=ASK_WEATHER, tools=WEATHER_TOOLS,  # type: ignore[arg-type]
                                        tool_choice="required", max_tokens=64, temperature=0) as helper:
        message = helper.get_final_completion().choices[0].message
    assert message.content is None and message.tool_calls
    # an agent loop's next turn: the helper's message appended as it came (annotations, parsed, a call's
    # index and parsed_arguments on it), then the tool's result
    turn = [*ASK_WEATHER, message, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=turn, tools=WEATHER_TOOLS,  # type: ignore[arg-type]
                                            max_tokens=16, temperature=0)
    assert answer.choices[0].finish_reason in {"stop", "length", "tool_calls"}


def test_a_tool_call_cut_by_max_tokens_is_a_call_never_marker_text(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": ASK_WEATHER, "tools": WEATHER_TOOLS,
                            "tool_choice": "required", "temperature": 0}
    whole = client.chat.completions.create(**args, max_tokens=64)
    assert whole.choices[0].finish_reason == "tool_calls" and whole.usage is not None
    n = whole.usage.completion_tokens  # the last of them is the end the grammar forces after the array
    # one token short: the array is complete, only that end was cut; the call stands
    short = client.chat.completions.create(**args, max_tokens=n - 1).choices[0]
    assert short.finish_reason == "tool_calls" and short.message.content is None
    assert short.message.tool_calls is not None
    assert [c.function.arguments for c in short.message.tool_calls] == \
        [c.function.arguments for c in whole.choices[0].message.tool_calls or []]
    # cut inside the arguments: the call as far as it got, finish_reason length (OpenAI's shape)
    cut = client.chat.completions.create(**args, max_tokens=n - 4).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None and cut.message.tool_calls
    full_args = (whole.choices[0].message.tool_calls or [])[0].function.arguments
    assert full_args.startswith(cut.message.tool_calls[0].function.arguments)
    streamed, finish, content = "", None, ""
    for chunk in client.chat.completions.create(**args, max_tokens=n - 4, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed += d.function.arguments or "" if d.function else ""
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (finish, content, streamed) == ("length", "", cut.message.tool_calls[0].function.arguments)


class City(BaseModel):
    name: str
    country: str
    population: int


def test_response_format_json_schema_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "mood": {"enum": ["calm", "busy"]}},
              "required": ["name", "mood"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person: name and mood, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
        max_tokens=64, temperature=0)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    out = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON: name, country, population."}],
        response_format=City, max_tokens=80, temperature=0)
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.name


def test_json_object_mode_returns_an_object(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object with a key 'colour'."}],
        response_format={"type": "json_object"}, max_tokens=48, temperature=0)
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_async_client_plain_and_streaming(gateway_url: str) -> None:
    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
        args: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 16, "temperature": 0}
        plain = await client.chat.completions.create(**args)
        text = ""
        async for chunk in await client.chat.completions.create(**args, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await client.close()
        return plain.choices[0].message.content or "", text

    plain, streamed = asyncio.run(main())
    assert plain and plain == streamed


def test_sixteen_concurrent_streams_complete_unmixed(gateway_url: str) -> None:
    """Each stream, run alongside 15 others, gives exactly the text it gives alone."""
    topics = ["cats", "rivers", "bread", "trains", "snow", "music", "chess", "tea", "bees", "maps", "clocks",
              "glass", "salt", "kites", "moss", "owls"]

    async def one(client: openai.AsyncOpenAI, topic: str) -> tuple[str, set[str]]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write one sentence about {topic}."}],
            max_tokens=12, temperature=0, stream=True)
        text, ids = "", set()
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        return text, ids

    async def main() -> tuple[list[tuple[str, set[str]]], list[str]]:
        client = openai.AsyncOpenAI(base_url=gateway_url, api_key=KEY, max_retries=0, timeout=300)
        together = await asyncio.gather(*(one(client, t) for t in topics))
        alone = [(await one(client, t))[0] for t in topics]
        await client.close()
        return together, alone

    together, alone = asyncio.run(main())
    assert [t for t, _ in together] == alone
    assert all(len(ids) == 1 for _, ids in together) and len({next(iter(i)) for _, i in together}) == 16

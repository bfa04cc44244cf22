"""Tool calls on the real model for every tool_choice mode, both backends: valid calls, right shapes."""

from __future__ import annotations

import json

import pytest

from decoding.chat_engine import ChatEngine, ChatRequest, ConstraintOptions
from decoding.constraints.bounds import Bounds
from decoding.drafters import CompositeDrafter, GrammarForcedDrafter, NgramDrafter
from decoding.generate import Engine, GenerationConfig
from decoding.loading import LoadedModel

pytestmark = pytest.mark.slow

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                     "required": ["query"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What's the weather in Paris in celsius?"}]


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_every_tool_choice_mode_on_the_real_model(embedded_model: LoadedModel, backend: str) -> None:
    engine = Engine(embedded_model, CompositeDrafter([GrammarForcedDrafter(embedded_model.tokenizer), NgramDrafter()]))
    chat = ChatEngine(engine, ConstraintOptions(backend=backend, bounds=Bounds()))

    def ask(choice: object, parallel: bool | None = None) -> tuple:
        request = ChatRequest(ASK, GenerationConfig(max_new_tokens=96), tools=TOOLS, tool_choice=choice,
                              parallel_tool_calls=parallel)
        return chat.complete(request)

    required, result = ask("required", parallel=False)
    assert required.finish_reason == "tool_calls" and required.content is None
    [call] = required.tool_calls
    assert call.name == "get_weather", result.text
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert result.stats.by_source.get("grammar", [0, 0])[1] > 0  # forced tokens were drafted and kept

    named, _ = ask({"type": "function", "function": {"name": "search"}})
    assert [c.name for c in named.tool_calls] == ["search"] and named.finish_reason == "tool_calls"
    assert isinstance(json.loads(named.tool_calls[0].arguments)["query"], str)

    none, _ = ask("none")
    assert none.tool_calls == [] and none.content and none.finish_reason in ("stop", "length")

    auto, result = ask("auto")
    assert auto.finish_reason in ("stop", "length", "tool_calls")
    assert (auto.finish_reason == "tool_calls") == bool(auto.tool_calls)
    assert auto.tool_calls or auto.content == result.text


def test_response_format_json_object_and_schema(embedded_model: LoadedModel) -> None:
    drafter = CompositeDrafter([GrammarForcedDrafter(embedded_model.tokenizer), NgramDrafter()])
    chat = ChatEngine(Engine(embedded_model, drafter))
    ask = [{"role": "user", "content": "Give me a JSON object describing a cat with a name and an age."}]
    obj, _ = chat.complete(ChatRequest(ask, GenerationConfig(max_new_tokens=64),
                                       response_format={"type": "json_object"}))
    assert obj.finish_reason == "stop" and isinstance(json.loads(obj.content or ""), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "enum": [1, 2, 3, 4, 5]}},
              "required": ["name", "age"], "additionalProperties": False}
    typed, _ = chat.complete(ChatRequest(ask, GenerationConfig(max_new_tokens=64), response_format={
        "type": "json_schema", "json_schema": {"name": "cat", "schema": schema, "strict": True}}))
    assert typed.finish_reason == "stop" and set(typed.parsed) == {"name", "age"}


def test_bounds_reach_values_a_schema_leaves_free(embedded_model: LoadedModel) -> None:
    """json_object and a tool with `parameters: {}` leave every value free; under the shipped bounds the
    model finishes: at most `properties` keys of values of at most `string_length` characters or `digits`
    digits (unbounded, greedy decoding ran on inside one string or number to any max_tokens)."""
    chat = ChatEngine(Engine(embedded_model, NgramDrafter()), ConstraintOptions(backend="outlines", bounds=Bounds()))
    ask = [{"role": "user", "content": "What time is it? Answer as JSON"}]
    obj, _ = chat.complete(ChatRequest(ask, GenerationConfig(max_new_tokens=400),
                                       response_format={"type": "json_object"}))
    assert obj.finish_reason == "stop", obj.content
    parsed = json.loads(obj.content or "")
    assert isinstance(parsed, dict) and 1 <= len(parsed) <= Bounds().properties
    assert all(len(str(v)) <= Bounds().string_length for v in parsed.values())
    tool = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    call, result = chat.complete(ChatRequest(ask, GenerationConfig(max_new_tokens=400), tools=tool,
                                             tool_choice="required"))
    assert call.finish_reason == "tool_calls", result.text
    assert call.tool_calls[0].name == "get_time" and isinstance(json.loads(call.tool_calls[0].arguments), dict)

"""tools / tool_choice parsing, the schema of a valid call array, and parsing calls out of an output."""

from __future__ import annotations

import json

import jsonschema
import pytest

from decoding.constraints.spec import TOOL_CALL_MARKER
from decoding.errors import ToolError, UnknownToolError
from decoding.tools import calls_schema, parse_tool_choice, parse_tools, render_calls, tool_calls_from

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BOOK = {"type": "function", "function": {
    "name": "book", "parameters": {
        "type": "object",
        "properties": {"guest": {"$ref": "#/$defs/person"}, "nights": {"type": "integer"}},
        "required": ["guest", "nights"],
        "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}}}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters at all


def test_tools_parse_with_defaults() -> None:
    tools = parse_tools([WEATHER, PING])
    assert [t.name for t in tools] == ["get_weather", "ping"]
    assert tools[1].parameters["type"] == "object" and tools[1].parameters["properties"] == {}


@pytest.mark.parametrize(("tools", "param"), [
    ({"not": "a list"}, "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "tools[0].function.strict"),
])
def test_malformed_tools_name_the_field(tools: object, param: str) -> None:
    with pytest.raises(ToolError) as err:
        parse_tools(tools)
    assert err.value.param == param


def test_every_tool_choice_mode() -> None:
    tools = parse_tools([WEATHER, BOOK])
    assert parse_tool_choice(None, tools).mode == "auto"
    assert parse_tool_choice(None, []).mode == "none"
    none = parse_tool_choice("none", tools)
    assert none.mode == "none" and none.allowed == ()
    auto = parse_tool_choice("auto", tools)
    assert auto.allowed == ("get_weather", "book") and auto.max_calls is None
    assert parse_tool_choice("required", tools, parallel_tool_calls=False).max_calls == 1
    named = parse_tool_choice({"type": "function", "function": {"name": "book"}}, tools)
    assert (named.mode, named.allowed, named.max_calls) == ("required", ("book",), 1)
    allowed = parse_tool_choice({"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "book"}}]}}, tools)
    assert (allowed.mode, allowed.allowed) == ("auto", ("book",))


def test_a_named_tool_absent_from_tools_is_a_clear_error() -> None:
    with pytest.raises(UnknownToolError) as err:
        parse_tool_choice({"type": "function", "function": {"name": "send_email"}}, parse_tools([WEATHER]))
    assert err.value.code == "tool_not_found" and err.value.param == "tool_choice"
    assert "send_email" in str(err.value) and "get_weather" in str(err.value)


@pytest.mark.parametrize("choice", ["sometimes", 3, {"type": "function"}, {"type": "custom"}])
def test_bad_tool_choice(choice: object) -> None:
    with pytest.raises(ToolError):
        parse_tool_choice(choice, parse_tools([WEATHER]))


def test_required_without_tools() -> None:
    with pytest.raises(ToolError, match="no 'tools'"):
        parse_tool_choice("required", [])


def test_calls_schema_accepts_valid_calls_only() -> None:
    tools = parse_tools([WEATHER, BOOK, PING])
    schema = calls_schema(tools, parse_tool_choice("auto", tools))
    jsonschema.Draft202012Validator.check_schema(schema)
    ok = [{"name": "book", "arguments": {"guest": {"name": "Ada"}, "nights": 2}},
          {"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "ping", "arguments": {}}]
    jsonschema.validate(ok, schema)  # $ref of a tool's own $defs still resolves
    for bad in ([], [{"name": "book", "arguments": {"guest": {}, "nights": 2}}],
                [{"name": "fly", "arguments": {}}], [{"name": "ping", "arguments": {"x": 1}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = calls_schema(tools, parse_tool_choice("auto", tools, parallel_tool_calls=False))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok, single)


def test_calls_round_trip_through_the_history_form() -> None:
    history = [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    text = render_calls(history)
    assert text == '<tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}}]'
    calls = tool_calls_from(json.loads(text.removeprefix(TOOL_CALL_MARKER)))
    assert len(calls) == 1
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Oslo"}
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29


def test_only_schema_keywords_move_or_change_in_the_calls_schema() -> None:
    """A property named `definitions` or `$defs`, and a `$ref` inside a `const`, are the tool's own data
    (a trial's review found them dropped: no call could satisfy `required`)."""
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["term", "definitions", "$defs", "kind"],
        "properties": {"term": {"$ref": "#/$defs/word"}, "definitions": {"type": "integer"},
                       "$defs": {"type": "boolean"}, "kind": {"const": {"$ref": "#/not/a/schema"}}},
        "$defs": {"word": {"type": "string"}}}}}
    tools = parse_tools([PING, lookup])
    schema = calls_schema(tools, parse_tool_choice("required", tools))
    call = [{"name": "lookup", "arguments": {"term": "x", "definitions": 3, "$defs": True,
                                             "kind": {"$ref": "#/not/a/schema"}}}]
    jsonschema.validate(call, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "lookup", "arguments": {**call[0]["arguments"], "term": 3}}], schema)


def test_an_unsupported_ref_names_its_tool() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "string"}}}}}
    tools = parse_tools([WEATHER, bad])
    with pytest.raises(ToolError) as err:
        calls_schema(tools, parse_tool_choice("auto", tools))
    assert err.value.param == "tools[1].function.parameters" and "'#/properties/b'" in str(err.value)

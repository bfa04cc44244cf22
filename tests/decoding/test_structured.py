"""response_format parsing, output planning under each tool_choice, preflight by name, output checks."""

from __future__ import annotations

import json

import pytest

from decoding.constraints.backends import make_backend
from decoding.constraints.base import ConstraintError, UnsupportedKeywordError
from decoding.constraints.spec import GrammarSpec
from decoding.errors import InvalidRequestError
from decoding.structured import (
    OutputValidationError,
    parse_response_format,
    plan_output,
)
from decoding.tokenizer import Tokenizer
from decoding.tools import parse_tool_choice, parse_tools
from tests.decoding.test_tools import BOOK, WEATHER

TOOLS = parse_tools([WEATHER, BOOK])
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"]}


def _format(schema: dict, strict: bool | None = None) -> dict:
    spec: dict = {"name": "person", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


@pytest.mark.parametrize(("raw", "param"), [
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "nope"}}},
     "response_format.json_schema.schema"),
])
def test_bad_response_formats_name_the_field(raw: dict, param: str) -> None:
    with pytest.raises((InvalidRequestError, ConstraintError)) as err:
        parse_response_format(raw)
    assert err.value.param == param


def test_plans_per_mode() -> None:
    text = parse_response_format(None)
    assert plan_output(TOOLS, parse_tool_choice("none", TOOLS), text, "xgrammar").spec is None
    auto = plan_output(TOOLS, parse_tool_choice("auto", TOOLS), text, "xgrammar").spec
    assert auto is not None and auto.free_text and auto.calls_schema is not None and auto.json_schema is None
    required = plan_output(TOOLS, parse_tool_choice("required", TOOLS), parse_response_format(_format(PERSON)),
                           "xgrammar").spec
    assert required is not None and not required.free_text and required.json_schema is None
    json_or_call = plan_output(TOOLS, parse_tool_choice("auto", TOOLS), parse_response_format(_format(PERSON)),
                               "xgrammar").spec
    assert json_or_call is not None and json_or_call.json_schema == PERSON and not json_or_call.free_text
    json_only = plan_output([], parse_tool_choice(None, []), parse_response_format({"type": "json_object"}),
                            "outlines").spec
    assert json_only is not None and json_only.json_schema == {"type": "object"} and json_only.calls_schema is None


def test_unenforced_keywords_are_refused_by_name_unless_strict_is_false() -> None:
    with pytest.raises(UnsupportedKeywordError) as err:  # outlines has no numeric bounds
        plan_output([], parse_tool_choice(None, []), parse_response_format(_format(PERSON)), "outlines")
    assert "'minimum' at /properties/age" in str(err.value)
    assert err.value.param == "response_format.json_schema.schema"
    plan = plan_output([], parse_tool_choice(None, []), parse_response_format(_format(PERSON, strict=False)),
                       "outlines")
    assert [u.keyword for u in plan.validated_after] == ["minimum"]
    with pytest.raises(OutputValidationError, match="minimum"):  # validated after, against the full schema
        plan.finish('{"name":"Ada","age":-3}', "stop")
    assert plan.finish('{"name":"Ada","age":3}', "stop").parsed == {"name": "Ada", "age": 3}


def test_strict_false_generates_without_what_the_backend_lacks_and_checks_it_after(
        embedded_tokenizer: Tokenizer) -> None:
    """outlines has no `hostname` format: handed over, it refused to compile the schema that `strict: false`
    asked to generate loosely (a review). The generated schema leaves it out; the check after keeps it."""
    schema = {"type": "object", "properties": {"host": {"type": "string", "format": "hostname", "maxLength": 20},
                                               "n": {"type": "integer", "multipleOf": 3}}, "required": ["host", "n"]}
    fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "h", "schema": schema,
                                                                         "strict": False}})
    plan = plan_output([], parse_tool_choice(None, []), fmt, "outlines")
    assert plan.spec is not None and plan.spec.json_schema is not None
    generated = plan.spec.json_schema["properties"]
    assert generated == {"host": {"type": "string", "maxLength": 20}, "n": {"type": "integer"}}
    assert plan.json_schema == schema  # what the output is checked against after
    make_backend("outlines", embedded_tokenizer).compile(plan.spec)  # compiles now
    with pytest.raises(OutputValidationError):
        plan.finish('{"host":"not a host!","n":4}', "stop")


def test_tool_parameters_are_preflighted_with_their_path() -> None:
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}}}}])
    with pytest.raises(UnsupportedKeywordError) as err:
        plan_output(tools, parse_tool_choice("auto", tools), parse_response_format(None), "xgrammar")
    assert err.value.param == "tools[0].function.parameters" and "'multipleOf' at /properties/n" in str(err.value)


def test_finish_shapes_outputs() -> None:
    plan = plan_output(TOOLS, parse_tool_choice("auto", TOOLS), parse_response_format(None), "xgrammar")
    calls = plan.finish('<tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}}]', "stop")
    assert calls.finish_reason == "tool_calls" and calls.content is None
    assert [c.name for c in calls.tool_calls] == ["get_weather"]
    text = plan.finish("It is sunny.", "stop")
    assert (text.content, text.tool_calls, text.finish_reason) == ("It is sunny.", [], "stop")
    cut = plan.finish('<tool_call>[{"name":"get_wea', "length")
    assert (cut.content, cut.tool_calls, cut.finish_reason) == (None, [], "length")  # never the marker syntax


def test_calls_cut_by_max_tokens_come_back_as_calls() -> None:
    plan = plan_output(TOOLS, parse_tool_choice("required", TOOLS), parse_response_format(None), "xgrammar")
    # complete and valid: only the end the grammar forces after the array was cut
    whole = plan.finish('<tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}}]', "length")
    assert (whole.finish_reason, [c.name for c in whole.tool_calls], whole.content) == ("tool_calls", ["get_weather"],
                                                                                        None)
    # cut inside the second call's arguments: the first whole, the second as far as it got (OpenAI's shape)
    cut = plan.finish('<tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}}, '
                      '{"name":"get_weather","arguments":{"city":"Be', "length")
    assert cut.finish_reason == "length" and cut.content is None
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather", '{"city":"Oslo"}'),
                                                               ("get_weather", '{"city":"Be')]
    assert len({c.id for c in cut.tool_calls}) == 2
    # a call cut before its arguments began is left out
    early = plan.finish('<tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_', "length")
    assert [c.name for c in early.tool_calls] == ["get_weather"] and early.finish_reason == "length"
    bare = plan.finish('<tool_call>[{"name":"get_weather","arguments":', "length")  # nothing of them yet
    assert (bare.content, bare.tool_calls) == (None, [])
    # cut inside the marker itself: neither the marker's text nor a call (a review found it as content)
    marker = plan.finish("<tool_ca", "length")
    assert (marker.content, marker.tool_calls, marker.finish_reason) == (None, [], "length")
    # complete but failing the schema (a keyword validated after): the 422 of a finished output
    with pytest.raises(OutputValidationError):
        plan.finish('<tool_call>[{"name":"get_weather","arguments":{}}]', "length")
    with pytest.raises(OutputValidationError):
        plan.finish('<tool_call>[{"name":"get_weather","arguments":{}}]', "stop")


def test_two_property_orders_are_two_grammars() -> None:
    """A grammar writes properties in the schema's order; one cache key for both orders wrote the second
    schema in the first one's order (a review)."""
    a = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    b = {"type": "object", "properties": {"age": {"type": "integer"}, "name": {"type": "string"}}}
    assert GrammarSpec(json_schema=a).key() != GrammarSpec(json_schema=b).key()
    assert GrammarSpec(json_schema=a).key() == GrammarSpec(json_schema=json.loads(json.dumps(a))).key()

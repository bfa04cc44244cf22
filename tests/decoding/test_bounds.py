"""Bounds on what a schema leaves unbounded: the bounded schema's values are valid for the caller's."""

from __future__ import annotations

import re

import jsonschema
import pytest

from decoding.constraints.backends import make_backend
from decoding.constraints.bounds import FORMAT_PATTERNS, Bounds, bound_schema
from decoding.constraints.spec import GrammarSpec
from decoding.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {
    "free": {"type": "string"}, "short": {"type": "string", "maxLength": 3}, "pick": {"type": "string", "enum": ["x"]},
    "tags": {"type": "array", "items": {"type": "string"}}, "mail": {"type": "string", "format": "email"},
    "day": {"type": "string", "format": "date"}, "code": {"type": "string", "pattern": "^[A-Z]+$"},
    "count": {"type": "integer"}, "floor": {"type": "integer", "minimum": 5}, "ratio": {"type": "number"},
    "maybe": {"type": ["string", "null"]}}}


def test_only_unbounded_values_get_bounds() -> None:
    props = bound_schema(SCHEMA, Bounds(string_length=40, digits=6), "xgrammar")["properties"]
    assert props["free"]["maxLength"] == 40 and props["tags"]["items"]["maxLength"] == 40
    assert props["tags"]["maxItems"] == 4
    assert props["maybe"]["maxLength"] == 40
    assert props["short"]["maxLength"] == 3 and "maxLength" not in props["pick"]
    assert props["day"] == {"type": "string", "format": "date"} and props["code"] == SCHEMA["properties"]["code"]
    assert "format" not in props["mail"] and props["mail"]["pattern"] == FORMAT_PATTERNS["email"]
    assert (props["count"]["minimum"], props["count"]["maximum"]) == (-999999, 999999)
    assert (props["floor"]["minimum"], props["floor"]["maximum"]) == (5, 999999)
    assert "free" in SCHEMA["properties"] and "maxLength" not in SCHEMA["properties"]["free"]  # caller's untouched


def test_open_maps_get_a_key_limit_and_closed_objects_none() -> None:
    schema = {"type": "object", "properties": {
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "labels": {"type": "object", "properties": {"app": {"type": "string"}}, "additionalProperties": True,
                   "minProperties": 12},
        "fixed": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
        "given": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2}}}
    props = bound_schema(schema, Bounds(properties=5), "xgrammar")["properties"]
    assert props["headers"]["maxProperties"] == 5
    assert props["labels"]["maxProperties"] == 12  # 1 declared + 5, but never below minProperties
    assert "maxProperties" not in props["fixed"] and props["given"]["maxProperties"] == 2
    outlines = bound_schema(schema, Bounds(properties=5), "outlines")["properties"]
    assert outlines["headers"]["maxProperties"] == 5  # a map: outlines_maps.py counts its keys
    assert "maxProperties" not in outlines["labels"]  # beside declared properties outlines generates those only


def test_outlines_gets_its_own_digit_keywords_and_free_values_are_integers_there() -> None:
    """outlines-core's fraction keywords make a language without 5 or 5.25, and with "12." (not JSON, a
    review found): a declared number keeps them (unbounded, greedy decoding runs on in its digits), a value
    the schema leaves free is an integer there, whose digit keyword is exact."""
    props = bound_schema(SCHEMA, Bounds(digits=6), "outlines")["properties"]
    assert props["count"]["maxDigits"] == 6 and "maximum" not in props["count"]
    assert props["ratio"]["maxDigitsInteger"] == 6 and props["ratio"]["maxDigitsFraction"] == 6
    free = bound_schema({"type": "object"}, Bounds(digits=6), "outlines")["additionalProperties"]
    assert free["type"] == ["string", "integer", "boolean", "null"] and free["maxDigits"] == 6


def test_an_integer_bound_past_the_digit_limit_gets_a_side_it_can_meet() -> None:
    """A caller's minimum of 10**13 got a maximum of 10**12 - 1 beside it: xgrammar refused to compile."""
    schema = {"type": "object", "properties": {"big": {"type": "integer", "minimum": 10**13},
                                               "low": {"type": "integer", "exclusiveMaximum": -(10**13)}}}
    props = bound_schema(schema, Bounds(digits=6), "xgrammar")["properties"]
    assert props["big"] == {"type": "integer", "minimum": 10**13, "maximum": 10**13 + 999999}
    assert props["low"] == {"type": "integer", "exclusiveMaximum": -(10**13), "minimum": -(10**13) - 999999}


def test_data_inside_a_schema_is_never_bounded() -> None:
    schema = {"type": "object", "properties": {"kind": {"const": {"type": "string"}},
                                               "pick": {"enum": [{"type": "array"}], "default": {"type": "string"}}}}
    assert bound_schema(schema, Bounds(), "outlines")["properties"] == schema["properties"]


@pytest.mark.parametrize(("fmt", "values"), [
    ("email", ["anna.schmidt@example.com", "j+x@mail.example.co"]),
    ("hostname", ["api.example.com", "localhost"]),
    ("uri", ["https://example.com/a/b.html", "http://x.io"]),
    ("time", ["14:30:00Z", "23:59:59.123456+02:00"]),
    ("date-time", ["2026-04-18T14:30:00Z", "2026-12-02T08:00:00.5-05:00"]),
])
def test_format_patterns_match_valid_values_and_stay_short(fmt: str, values: list[str]) -> None:
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for value in values:
        assert re.fullmatch(FORMAT_PATTERNS[fmt].strip("^$"), value), value
        assert checker.conforms(value, fmt)
    assert not re.fullmatch(FORMAT_PATTERNS[fmt].strip("^$"), "a" * 400)


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_values_a_schema_leaves_free_are_bounded_scalars(backend: str) -> None:
    """json_object's {"type": "object"}, additionalProperties true or {}, empty property and item schemas."""
    bounds = Bounds(string_length=7, properties=3)
    json_object = bound_schema({"type": "object"}, bounds, backend)
    assert json_object["maxProperties"] == 3
    free = json_object["additionalProperties"]
    number = "integer" if backend == "outlines" else "number"
    assert free["type"] == ["string", number, "boolean", "null"] and free["maxLength"] == 7
    schema = {"type": "object", "properties": {"any": {}, "list": {"type": "array"}, "open": {
        "type": "object", "additionalProperties": True}, "closed": {"type": "object", "properties": {}}},
        "required": ["any"]}
    props = bound_schema(schema, bounds, backend)["properties"]
    assert props["any"] == free and props["list"]["items"] == free and props["open"]["additionalProperties"] == free
    assert "additionalProperties" not in props["closed"]  # declared properties: not a free object
    assert "additionalProperties" not in bound_schema(schema, bounds, backend)  # nor is the root
    # what the bounded schema admits, the caller's admits
    value = {"any": "abc", "list": [1, None], "open": {"k": True}, "closed": {}}
    jsonschema.validate(value, bound_schema(schema, bounds, backend))
    jsonschema.validate(value, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"any": "x" * 8}, bound_schema(schema, bounds, backend))


MIN_ONLY = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 5}, "essay": {"type": "string", "minLength": 100},
    "mail": {"type": "string", "format": "email", "minLength": 5},
    "code": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2}}, "required": ["name"],
    "additionalProperties": False}


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_a_minimum_length_alone_still_gets_a_maximum(backend: str) -> None:
    """A minLength is no bound: such a string gets a maxLength too (never below the minimum), where the backend
    enforces lengths. Beside a pattern or format outlines enforces the lengths and xgrammar the shape."""
    props = bound_schema(MIN_ONLY, Bounds(string_length=40), backend)["properties"]
    assert props["name"]["maxLength"] == 40 and props["essay"]["maxLength"] == 100
    if backend == "outlines":
        assert props["mail"]["maxLength"] == 40 and props["code"]["maxLength"] == 40
    else:
        assert props["mail"]["pattern"] == FORMAT_PATTERNS["email"] and "format" not in props["mail"]
        assert "maxLength" not in props["mail"] and props["code"] == MIN_ONLY["properties"]["code"]


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_a_bounded_minimum_length_string_ends_in_the_real_grammar(embedded_tokenizer: Tokenizer,
                                                                  backend: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "minLength": 5}}, "required": ["name"],
              "additionalProperties": False}
    grammar = make_backend(backend, embedded_tokenizer).compile(
        GrammarSpec(json_schema=bound_schema(schema, Bounds(string_length=12), backend)))

    end = embedded_tokenizer.turn_end_id
    assert end is not None

    def walk(text: str) -> tuple[bool, bool]:  # (every token allowed, the output may end after them)
        state = grammar.new()
        for token in embedded_tokenizer.encode(text):
            if not state.allows(token):
                return False, False
            state.accept(token)
        return True, state.allows(end)

    assert walk('{"name":"' + "ab cd" * 2 + '"}') == (True, True)  # 10 characters
    assert walk('{"name":"' + "ab cd" * 2) == (True, False)
    assert walk('{"name":"abc"}') == (False, False)  # below the caller's minLength
    assert walk('{"name":"' + "ab cd " * 3) == (False, False)  # 18 characters: past the bound

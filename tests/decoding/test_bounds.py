"""Bounds on what a schema leaves unbounded: the bounded schema's values are valid for the caller's."""

from __future__ import annotations

import re

import jsonschema
import pytest

from decoding.constraints.bounds import FORMAT_PATTERNS, Bounds, bound_schema

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


def test_outlines_gets_its_own_digit_keywords() -> None:
    props = bound_schema(SCHEMA, Bounds(digits=6), "outlines")["properties"]
    assert props["count"]["maxDigits"] == 6 and "maximum" not in props["count"]
    assert props["ratio"]["maxDigitsInteger"] == 6 and props["ratio"]["maxDigitsFraction"] == 6


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
    assert free["type"] == ["string", "number", "boolean", "null"] and free["maxLength"] == 7
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

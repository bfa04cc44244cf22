"""Preflight: keywords a backend would not enforce are refused by name; malformed schemas are clear errors."""

from __future__ import annotations

import json

import pytest

from decoding.constraints.backends import make_backend
from decoding.constraints.base import ConstraintError, UnsupportedKeywordError
from decoding.constraints.corpus import load_corpus
from decoding.constraints.outlines_backend import OutlinesBackend
from decoding.constraints.preflight import preflight, unsupported_keywords, validate_output
from decoding.tokenizer import Tokenizer


def corpus() -> list[dict]:
    return load_corpus(include_unsupported=True)


def test_numeric_bounds_are_refused_by_outlines_and_enforced_by_xgrammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    with pytest.raises(UnsupportedKeywordError, match=r"'minimum' at /properties/n"):
        preflight(schema, "outlines")
    assert preflight(schema, "xgrammar") == []


def test_nested_keywords_and_formats_are_found_with_their_path() -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                       "ip": {"type": "string", "format": "ipv4"}},
        "$defs": {"x": {"not": {"type": "null"}}},
    }
    found = {str(u) for u in unsupported_keywords(schema, "outlines")}
    assert found == {"'uniqueItems' at /properties/tags", "'format: ipv4' at /properties/ip", "'not' at /$defs/x"}


def test_validate_after_returns_what_will_be_checked_later() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 5}}}
    missing = preflight(schema, "outlines", allow_validate_after=True)
    assert [m.keyword for m in missing] == ["multipleOf"]
    with pytest.raises(ConstraintError, match="does not match the schema"):
        validate_output('{"n": 7}', schema)
    assert validate_output('{"n": 10}', schema) == {"n": 10}


def test_a_refusal_names_the_policy_settings_that_would_take_the_schema() -> None:
    neither = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 5}}}  # no backend has it
    with pytest.raises(UnsupportedKeywordError) as err:
        preflight(neither, "xgrammar")
    assert "a route's constraints.allow_validate_after does this for every request" in str(err.value)
    assert "backend enforces this whole schema" not in str(err.value)
    bounded = {"type": "integer", "minimum": 1}  # xgrammar enforces numeric bounds, outlines does not
    with pytest.raises(UnsupportedKeywordError, match="the xgrammar backend enforces this whole schema"):
        preflight(bounded, "outlines")


def test_malformed_schemas_are_clear_errors() -> None:
    with pytest.raises(ConstraintError, match="invalid JSON schema"):
        preflight({"type": "object", "properties": {"a": {"type": "strnig"}}}, "outlines")
    with pytest.raises(ConstraintError, match="must be an object"):
        unsupported_keywords({"type": "object", "properties": {"a": 3}}, "outlines")
    with pytest.raises(ConstraintError, match="unknown constraint backend"):
        unsupported_keywords({}, "llguidance")
    with pytest.raises(ConstraintError, match="not JSON"):
        validate_output("{", {})


def test_the_corpus_is_clean_but_for_its_unsupported_entries() -> None:
    entries = corpus()
    assert len([e for e in entries if not e["id"].startswith("unsupported-")]) >= 40
    for entry in entries:
        if entry["id"].startswith("unsupported-"):
            with pytest.raises(UnsupportedKeywordError):
                preflight(entry["schema"], "outlines")
        else:
            assert preflight(entry["schema"], "outlines") == [], entry["id"]


@pytest.mark.parametrize(("backend", "dropped"), [("outlines", ["pattern (with maxLength)"]),
                                                  ("xgrammar", ["maxLength (with pattern)"])])
def test_a_length_with_a_pattern_is_named_for_the_side_each_backend_drops(backend: str, dropped: list[str]) -> None:
    # measured: outlines keeps the length and drops the pattern; xgrammar the other way round
    schema = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    assert [u.keyword for u in unsupported_keywords(schema, backend)] == dropped


def test_formats_are_validated() -> None:
    with pytest.raises(ConstraintError, match="email"):
        validate_output('"not an address"', {"type": "string", "format": "email"})


# jsonschema passes any string for these formats unless its format extras are installed (pyproject.toml):
# the backends' date grammars take a day the month lacks, and xgrammar's uri one a bare scheme
@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date-time", "2024-02-29T12:00:00Z", "2024-02-30T12:00:00Z"),
    ("time", "23:59:59+01:00", "24:00:00Z"),
    ("uri", "https://example.com/a", "example.com/a"),
    ("hostname", "api.example.com", "-bad-.example.com"),
    ("duration", "P1DT2H", "P1H"),
])
def test_every_format_a_backend_writes_is_checked_after(fmt: str, good: str, bad: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert validate_output(json.dumps(good), schema) == good
    with pytest.raises(ConstraintError, match=fmt):
        validate_output(json.dumps(bad), schema)


def test_outlines_counts_the_keys_of_maps_and_only_of_maps() -> None:
    import re

    from outlines_core import json_schema

    from decoding.constraints.outlines_maps import counted_map_regex

    def build(text: str) -> str:
        return str(json_schema.build_regex_from_schema(text, ""))

    schema = {"type": "object", "properties": {"h": {"type": "object", "additionalProperties": {"$ref": "#/$defs/n"},
                                                      "minProperties": 1, "maxProperties": 2}},
              "required": ["h"], "$defs": {"n": {"enum": [1, 2]}}}
    regex = counted_map_regex(schema, build)
    fits = {text: bool(re.fullmatch(regex, text)) for text in
            ['{"h":{}}', '{"h":{"a":1}}', '{"h":{"a":1,"b":2}}', '{"h":{"a":1,"b":2,"c":1}}', '{"h":{"a":3}}']}
    assert fits == {'{"h":{}}': False, '{"h":{"a":1}}': True, '{"h":{"a":1,"b":2}}': True,
                    '{"h":{"a":1,"b":2,"c":1}}': False, '{"h":{"a":3}}': False}
    assert unsupported_keywords(schema, "outlines") == []
    empty = counted_map_regex({"type": "object", "additionalProperties": True, "maxProperties": 0}, build)
    assert re.fullmatch(empty, "{}") and not re.fullmatch(empty, '{"a":1}')
    with pytest.raises(ConstraintError, match="at least 3 and at most 2"):
        counted_map_regex({"type": "object", "additionalProperties": True, "minProperties": 3, "maxProperties": 2},
                          build)
    plain = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert counted_map_regex(plain, build) == build(json.dumps(plain))  # no counts: outlines' own regex


TREE = {"$defs": {"node": {"type": "object", "required": ["v", "kids"], "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}


def test_a_recursive_ref_is_named_for_outlines_and_left_to_xgrammar() -> None:
    """outlines-core cuts recursion off at a fixed depth and then let `{"v":1,}` through (found by a
    trial through the gateway); xgrammar's grammar recurses as the schema does."""
    with pytest.raises(UnsupportedKeywordError, match=r"'\$ref \(recursive\)' at /\$defs/node/properties/kids/items;"
                                                      r" send the schema with \"strict\": false") as err:
        preflight(TREE, "outlines")
    assert "at /;" not in str(err.value) and "at /," not in str(err.value)  # the root's $ref closes no cycle
    assert "the xgrammar backend enforces this whole schema (a route's constraints.backend" in str(err.value)
    assert preflight(TREE, "xgrammar") == []
    mutual = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
                        "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}},
                        "leaf": {"type": "string"}},
              "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"$ref": "#/$defs/leaf"}}}
    found = [str(u) for u in preflight(mutual, "outlines", allow_validate_after=True)]
    assert found == ["'$ref (recursive)' at /$defs/a/properties/b", "'$ref (recursive)' at /$defs/b/properties/a"]


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
     r"\$ref '#/\$defs/missing' at /properties/a points at nothing in the schema"),
    ({"$ref": "https://example.com/schema.json"}, r"at /: only references inside the schema"),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/b~1c"}, "b/c": {"type": "string"}}}, None),
])
def test_refs_must_point_inside_the_schema(schema: dict, message: str | None) -> None:
    for backend in ("outlines", "xgrammar"):
        if message is None:
            assert preflight(schema, backend) == []
        else:
            with pytest.raises(ConstraintError, match=message):
                preflight(schema, backend)


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_an_all_of_of_several_schemas_is_refused_one_schema_is_not(backend: str) -> None:
    # outlines writes the branches one after another ({"a":1}{"b":"x"}), xgrammar ignores them (measured)
    a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    b = {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
    with pytest.raises(UnsupportedKeywordError, match=r"'allOf \(more than one schema.*' at /properties/x"):
        preflight({"type": "object", "properties": {"x": {"allOf": [a, b]}}}, backend)
    assert preflight({"$defs": {"A": a}, "allOf": [{"$ref": "#/$defs/A"}]}, backend) == []  # pydantic's shape


TAGGED = {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": "card"}, "last4": {"type": "string"}},
     "required": ["kind", "last4"]},
    {"type": "object", "properties": {"kind": {"const": "bank"}, "iban": {"type": "string"}}, "required": ["kind"]},
]}


@pytest.mark.parametrize("one_of", [
    TAGGED["oneOf"],
    [{"type": "string"}, {"type": "integer"}, {"type": "null"}],
    [{"enum": ["a", "b"]}, {"enum": ["c", 1]}],
    [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],  # a pydantic discriminated union
])
@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_a_one_of_no_value_can_match_twice_is_enforced(one_of: list, backend: str) -> None:
    defs = {name: {"type": "object", "properties": {"pet": {"const": name.lower()}, "age": {"type": "integer"}},
                   "required": ["pet", "age"]} for name in ("Cat", "Dog")}
    assert preflight({"$defs": defs, "type": "object", "properties": {"x": {"oneOf": one_of}}}, backend) == []


@pytest.mark.parametrize("one_of", [
    [{"type": "number"}, {"type": "integer"}],  # 5 matches both: an integer is a number
    [{"enum": [1, "a"]}, {"const": 1.0}],  # 1 == 1.0
    [{"type": "object", "properties": {"a": {"type": "string"}}},
     {"type": "object", "properties": {"b": {"type": "string"}}}],  # {} and {"a": "x"} match both
    [{"type": "object", "properties": {"kind": {"const": "x"}}, "required": ["kind"]},
     {"type": "object", "properties": {"kind": {"const": "y"}}}],  # the second does not require its tag
    [{"type": "string"}, {"maxLength": 3}],  # no type: anything
])
@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_a_one_of_whose_branches_may_overlap_is_refused(one_of: list, backend: str) -> None:
    # both backends generate oneOf as anyOf; the output then matches two branches and fails validation
    with pytest.raises(UnsupportedKeywordError, match=r"'oneOf \(branches a value could match twice.*at /properties/x"):
        preflight({"type": "object", "properties": {"x": {"oneOf": one_of}}}, backend)
    missing = preflight({"oneOf": one_of}, backend, allow_validate_after=True)  # "strict": false
    assert [m.keyword.split(" ")[0] for m in missing] == ["oneOf"]


@pytest.mark.parametrize(("schema", "outlines", "xgrammar"), [
    # the backends keep one side of these pairs without a word (measured by a review)
    ({"type": "string", "format": "email", "pattern": "^b.*$"}, "format (with pattern)", "pattern (with format)"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]},
     "anyOf beside type, properties", "anyOf beside type, properties"),
    ({"properties": {"a": {"type": "integer"}}, "required": ["a"], "$ref": "#/$defs/B",
      "$defs": {"B": {"type": "object"}}}, "$ref beside properties, required", "$ref beside properties, required"),
    # a required property the schema does not declare: neither backend generates it
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
     "required 'b' (not in properties", "required 'b' (not in properties"),
])
def test_keywords_a_backend_would_drop_beside_others_are_named(schema: dict, outlines: str, xgrammar: str) -> None:
    for backend, expected in (("outlines", outlines), ("xgrammar", xgrammar)):
        found = [str(u) for u in unsupported_keywords(schema, backend)]
        assert any(expected in f for f in found), (backend, found)


@pytest.mark.parametrize(("pattern", "unsafe"), [
    ("^[A-Z]{3}$", False), ("^(a|b)$", False), ("abc", False), ("^\\d{5}(-\\d{4})?$", False), ("^[\\w.-]+$", False),
    ("^.{1,20}$", True), ("^[^0-9]{1,4}$", True), ("^a|b$", True), ("^abc", True), ("^[a-z\\s]+$", True),
])
def test_outlines_refuses_a_pattern_that_would_leave_its_string(pattern: str, unsafe: bool) -> None:
    """outlines writes a pattern between the quotes as it is: '{"x":"a"b"}' was a complete output of
    `^[^0-9]{1,4}$`, and not JSON (a review). xgrammar confines the pattern to the string."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}
    assert any(u.keyword.startswith("pattern (") for u in unsupported_keywords(schema, "outlines")) == unsafe
    assert unsupported_keywords(schema, "xgrammar") == []


def test_an_unsafe_pattern_really_leaves_the_string_on_outlines(embedded_tokenizer: Tokenizer) -> None:
    """What the refusal prevents, on the real backend: a quote inside the value, and the output complete."""
    grammar = OutlinesBackend(embedded_tokenizer, embedded_tokenizer.turn_end_id or 0).compile_json_schema(
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "^[^0-9]{1,4}$"}}, "required": ["x"],
         "additionalProperties": False}).new()
    for token in embedded_tokenizer.encode('{"x":"a"b"}'):
        assert grammar.allows(token)
        grammar.accept(token)


@pytest.mark.parametrize(("pattern", "outlines", "xgrammar"), [
    ("^(?!admin)[a-z]+$", "a lookahead assertion", "a lookahead assertion (xgrammar ignores it"),
    ("^(?=a)[a-z]$", "a lookahead assertion", "a lookahead assertion (xgrammar ignores it"),
    ("^(?<!x)y$", "a lookbehind assertion", "a lookbehind assertion"),
    ("^(a)\\1$", "a backreference", "a backreference"),
    ("^a\\bb$", "the word boundary \\b", "the word boundary \\b"),
    ("^\\p{L}+$", None, "the Unicode class \\p{...}"),
    # not these: a backspace in a class, an escaped parenthesis, a group that captures nothing
    ("^[\\b]$", None, None), ("^\\(?=$", None, None), ("^(?:ab)+$", None, None), ("^[(?=a]+$", None, None),
])
def test_regex_features_a_backend_cannot_enforce_are_named(pattern: str, outlines: str | None,
                                                           xgrammar: str | None) -> None:
    schema = {"type": "string", "pattern": pattern}
    for backend, expected in (("outlines", outlines), ("xgrammar", xgrammar)):
        found = [u.keyword for u in unsupported_keywords(schema, backend) if u.keyword.startswith("pattern (")]
        if expected is None:
            assert found == [], (backend, found)
        else:
            assert len(found) == 1 and found[0].startswith(f"pattern ({expected}"), (backend, found)


def test_xgrammar_really_ignores_a_lookahead(embedded_tokenizer: Tokenizer) -> None:
    """What the refusal prevents: compiled as it is, `^(?!ab)[a-z]{2}$` takes "ab" whole (xgrammar only logs
    that it ignores the lookahead)."""
    backend = make_backend("xgrammar", embedded_tokenizer)
    grammar = backend.compile_json_schema({"type": "string", "pattern": "^(?!ab)[a-z]{2}$"}).new()
    for token in embedded_tokenizer.encode('"ab"'):
        assert grammar.allows(token)
        grammar.accept(token)
    assert grammar.allows(embedded_tokenizer.turn_end_id or 0)


def test_xgrammar_compile_errors_read_without_its_source_paths(embedded_tokenizer: Tokenizer) -> None:
    backend = make_backend("xgrammar", embedded_tokenizer)
    with pytest.raises(ConstraintError) as err:  # an inline flag: jsonschema's regex check takes it, xgrammar not
        backend.compile_json_schema({"type": "string", "pattern": "^(?i)abc$"})
    assert str(err.value).startswith("xgrammar cannot compile this schema: Regex parsing error at position 4")
    assert ".cc:" not in str(err.value)

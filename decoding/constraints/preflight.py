"""Which JSON Schema keywords each backend enforces, and a check that names the ones it would not.

A constraint is never dropped silently: a keyword the chosen backend does not enforce is refused by
name, or (when the caller allows it) the output is generated under what the backend does enforce and
then validated against the full schema with `jsonschema`. Every constrained output is validated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from decoding.constraints.base import ConstraintError, UnsupportedKeywordError
from decoding.constraints.disjoint import branches_disjoint
from decoding.constraints.outlines_maps import COUNT_KEYS, is_map
from decoding.constraints.refs import check_refs, recursive_refs

# keywords that only annotate: nothing to enforce
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly"})
# structure every backend understands; the values of these are walked as sub-schemas
COMMON = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf",
                    "$ref", "$defs", "definitions", "additionalProperties", "minItems", "maxItems",
                    "minLength", "maxLength", "pattern", "format", "prefixItems"})
ENFORCED = {
    # outlines-core src/json_schema: no numeric bounds, no multipleOf / uniqueItems / contains / not, and
    # no min/maxProperties (its regex for a map repeats the keys {0,}): draftgate counts them for maps
    # itself (outlines_maps.py, MAP_COUNTS below), never beside declared properties
    "outlines": COMMON,
    # xgrammar 0.2.9 json_schema_converter: numeric bounds, and min/maxProperties as repetition counts
    "xgrammar": COMMON | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties",
                          "maxProperties"},
}
FORMATS = {
    "outlines": frozenset({"date-time", "date", "time", "uuid", "uri", "email"}),
    "xgrammar": frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
                           "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}),
}
LENGTH_KEYS = frozenset({"minLength", "maxLength"})
# keywords a backend enforces on maps only (objects with no declared properties, open to any key)
MAP_COUNTS = {"outlines": frozenset(COUNT_KEYS), "xgrammar": frozenset()}
# keywords whose values are data, never schemas: whatever rewrites a schema copies them as they are
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "required"})
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_SINGLE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


@dataclass(frozen=True)
class Unsupported:
    path: str  # JSON pointer to the schema object holding the keyword
    keyword: str

    def __str__(self) -> str:
        return f"'{self.keyword}' at {self.path or '/'}"


def unsupported_keywords(schema: Any, backend: str, path: str = "", root: Any = None) -> list[Unsupported]:
    """Every keyword (or format) in `schema` that `backend` would not enforce. `root`: the whole document
    `schema` is part of (itself when None), where its refs resolve."""
    root = schema if root is None else root
    if backend not in ENFORCED:
        raise ConstraintError(f"unknown constraint backend {backend!r} (known: {', '.join(ENFORCED)})")
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        raise ConstraintError(f"schema at {path or '/'} must be an object or a boolean, got {type(schema).__name__}")
    found: list[Unsupported] = []
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED[backend] and not (key in MAP_COUNTS[backend] and is_map(schema)):
            found.append(Unsupported(path, key))
        if key == "format" and value not in FORMATS[backend]:
            found.append(Unsupported(path, f"format: {value}"))
    found += _combinators(schema, path, root)
    lengths = sorted(LENGTH_KEYS & schema.keys())
    shaped = sorted({"pattern", "format"} & schema.keys())
    if lengths and shaped:  # both backends compile the pair but drop one side without a word (measured)
        dropped = shaped if backend == "outlines" else lengths
        kept = lengths if backend == "outlines" else shaped
        found += [Unsupported(path, f"{d} (with {', '.join(kept)})") for d in dropped]
    elif len(shaped) == 2:  # the same with each other: outlines keeps the pattern, xgrammar the format
        lost, keeps = ("format", "pattern") if backend == "outlines" else ("pattern", "format")
        found.append(Unsupported(path, f"{lost} (with {keeps})"))
    pattern = schema.get("pattern")
    if backend == "outlines" and isinstance(pattern, str) and (why := unsafe_pattern(pattern)) is not None:
        found.append(Unsupported(path, f"pattern ({why})"))
    if isinstance(pattern, str) and (feature := unsupported_regex(pattern, backend)) is not None:
        found.append(Unsupported(path, f"pattern ({feature})"))
    found += _undeclared_required(schema, path)
    for key in SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            found += unsupported_keywords(sub, backend, f"{path}/{key}/{name}", root)
    for key in SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            found += unsupported_keywords(sub, backend, f"{path}/{key}/{i}", root)
    for key in SUBSCHEMA_SINGLE:
        if key in schema and isinstance(schema[key], dict | bool):
            found += unsupported_keywords(schema[key], backend, f"{path}/{key}", root)
    return found


_COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")


def _combinators(schema: dict[str, Any], path: str, root: Any) -> list[Unsupported]:
    # both backends take these keywords, but not with their meaning (measured): an allOf of several
    # schemas becomes their outputs one after another (outlines: `{"a":1}{"b":"x"}`) or is ignored
    # (xgrammar); a oneOf is generated as an anyOf, exact only where no value matches two branches; and
    # beside other keywords ({"properties": ..., "anyOf": [{"required": ...}]}) one side is dropped
    found = []
    present = [k for k in _COMBINATORS if k in schema]
    siblings = [k for k in schema if k not in ANNOTATIONS and k not in (*_COMBINATORS, "$defs", "definitions")]
    if present and (siblings or len(present) > 1):
        beside = ", ".join(siblings + present[1:])
        found.append(Unsupported(path, f"{present[0]} beside {beside} (the backends keep one side: move them into "
                                       f"the {present[0]}'s schemas)"))
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        found.append(Unsupported(path, "allOf (more than one schema: merge them into one)"))
    one_of = schema.get("oneOf")
    if isinstance(one_of, list) and not branches_disjoint(one_of, root):
        found.append(Unsupported(path, "oneOf (branches a value could match twice: use anyOf, or tell them "
                                       "apart by a required property with a different const in each)"))
    return found


def _undeclared_required(schema: dict[str, Any], path: str) -> list[Unsupported]:
    # neither backend generates a required property the schema does not declare (measured): every
    # output would fail the schema
    required = schema.get("required")
    properties = schema.get("properties")
    declared: dict[str, Any] = properties if isinstance(properties, dict) else {}
    if not isinstance(required, list) or any(k in schema for k in _COMBINATORS):
        return []  # (beside a combinator: named as such)
    return [Unsupported(path, f"required '{name}' (not in properties: declare it)")
            for name in required if isinstance(name, str) and name not in declared]


def _scan(regex: str) -> Iterator[tuple[int, str, bool]]:
    """(position, token, inside a class) for a regex's escapes ("\\d", whole), its classes' openings ("[" or
    "[^", a ']' first in the class taken as itself) and its other characters outside classes; a class's
    other characters are skipped."""
    i, in_class = 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            yield i, regex[i : i + 2], in_class
            i += 2
        elif in_class:
            in_class = c != "]"
            i += 1
        elif c == "[":
            opening = "[^" if regex[i + 1 : i + 2] == "^" else "["
            yield i, opening, False
            start = i + len(opening)
            i = start + (regex[start : start + 1] == "]")
            in_class = True
        else:
            yield i, c, False
            i += 1


def unsafe_pattern(pattern: str) -> str | None:
    """Why outlines would let `pattern` out of its JSON string, or None. outlines-core writes a pattern
    between the string's quotes as it is (measured): '.', a negated class or \\S can match a quote, a
    backslash or a control character (not JSON); a '|' outside any group splits the whole regex; and a
    pattern anchored at one end only does not compile."""
    starts, ends = pattern.startswith("^"), pattern.endswith("$") and not pattern.endswith("\\$")
    if starts != ends:
        return "anchored at one end only"
    depth = 0
    for _, token, _ in _scan(pattern[int(starts): len(pattern) - int(ends)]):
        if token in ("\\S", "\\W", "\\D", "\\s"):
            return f"{token} can match a quote, a backslash or a control character"
        if token == "[^":
            return "a negated class can match a quote, a backslash or a control character"
        if token == ".":
            return "'.' can match a quote, a backslash or a control character"
        if token in ("^", "$"):
            return "an anchor inside it"
        if token == "|" and depth == 0:
            return "a '|' outside any group"
        depth += (token == "(") - (token == ")")
    return None


_LOOKAROUND = {"(?=": "lookahead", "(?!": "lookahead", "(?<=": "lookbehind", "(?<!": "lookbehind"}


def unsupported_regex(pattern: str, backend: str) -> str | None:
    """The regex feature in `pattern` that `backend` cannot enforce, or None. Measured on both: outlines-core
    builds no automaton for lookaround, backreferences or word boundaries; xgrammar refuses lookbehind,
    backreferences, word boundaries and \\p{...} classes, and ignores a lookahead without a word (only a
    log line: `^(?!ab)[a-z]{2}$` takes "ab")."""
    for i, token, in_class in _scan(pattern):
        escaped = token[1:] if token.startswith("\\") else ""
        if escaped in ("p", "P") and backend == "xgrammar":
            return f"the Unicode class \\{escaped}{{...}}"
        if not in_class and escaped in ("b", "B"):  # (in a class, \b is a backspace)
            return f"the word boundary \\{escaped}"
        if not in_class and escaped and escaped in "123456789k":
            return "a backreference"
        if token == "(" and (kind := next((k for p, k in _LOOKAROUND.items() if pattern.startswith(p, i)), None)):
            ignored = backend == "xgrammar" and kind == "lookahead"
            return f"a {kind} assertion" + (" (xgrammar ignores it: an output could break it)" if ignored else "")
    return None


def check_schema(schema: Any) -> None:
    """A malformed schema (not valid JSON Schema itself) is a clear error."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path)
        raise ConstraintError(f"invalid JSON schema at {where}: {exc.message}") from exc


def preflight(schema: Any, backend: str, allow_validate_after: bool = False) -> list[Unsupported]:
    """Raise for keywords the backend does not enforce, unless validating afterwards is allowed."""
    check_schema(schema)
    check_refs(schema)
    missing = _unenforced(schema, backend)
    if missing and not allow_validate_after:
        names = ", ".join(str(m) for m in missing)
        others = [b for b in ENFORCED if b != backend and not _unenforced(schema, b)]
        switch = (f"; the {others[0]} backend enforces this whole schema (a route's constraints.backend in the "
                  "gateway's policy)") if others else ""
        raise UnsupportedKeywordError(f"the {backend} backend does not enforce {names}; send the schema with "
                                      '"strict": false to generate under what it does enforce and validate '
                                      'the output against the whole schema after (a schema that names no "strict" '
                                      "counts as strict here: draftgate enforces every schema it can; a route's "
                                      f"constraints.allow_validate_after does this for every request){switch}")
    return missing


def _unenforced(schema: Any, backend: str) -> list[Unsupported]:
    missing = unsupported_keywords(schema, backend)
    if backend == "outlines":  # it cuts recursion off at a fixed depth (refs.py)
        missing += [Unsupported(path, "$ref (recursive)") for path in recursive_refs(schema)]
    return missing


def validate_output(text: str, schema: Any) -> Any:
    """Parse and validate a constrained output; the value, or ConstraintError saying what is wrong."""
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"output is not JSON: {exc}") from exc
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    try:
        validator.validate(value)
    except jsonschema.ValidationError as exc:
        raise ConstraintError(f"output does not match the schema: {exc.message}") from exc
    return value
